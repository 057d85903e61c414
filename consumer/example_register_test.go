package consumer_test

import (
	"context"
	"fmt"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// Register a typed handler, start the consumer and process one message.
func Example_register() {
	queue, cleanup := exampleQueue("payments")
	defer cleanup()
	ctx := context.Background()

	done := make(chan struct{})
	r := consumer.NewRouter()
	consumer.Register(r, queue, inboxtype.HandlerFunc[Payment](func(_ context.Context, m *inboxtype.Message[Payment]) error {
		// With the inbox, this runs inside the transaction that records m.Key.
		fmt.Printf("charge %s: %d cents (key %s, attempt %d)\n", m.Body.OrderID, m.Body.Cents, m.Key, m.Attempt)
		close(done)
		return nil // success: the delivery is acked
	}), &consumer.HandlerOpts{Queue: consumer.QueueOpts{Concurrency: 4}})

	c, err := consumer.New(&consumer.Config{URL: testenv.AMQPURL(), Router: r})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := c.Start(ctx); err != nil { // declares the topology, then consumes
		fmt.Println(err)
		return
	}
	fmt.Println("ready:", c.Ready())
	if err := examplePublish(queue, `{"order_id":"A-1","cents":1299}`); err != nil {
		fmt.Println(err)
	}
	if _, ok := wait(done); !ok {
		fmt.Println("timed out")
	}
	fmt.Println("stop:", c.Stop(ctx))
	// Output:
	// ready: true
	// charge A-1: 1299 cents (key payment:A-1, attempt 1)
	// stop: <nil>
}
