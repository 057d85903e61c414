package consumer_test

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
)

// Payment is a job whose business identity is its order.
type Payment struct {
	OrderID string `json:"order_id"`
	Cents   int    `json:"cents"`
}

// IdempotencyKey implements inboxtype.Keyer.
func (p Payment) IdempotencyKey() string { return "payment:" + p.OrderID }

// Register a typed handler, start the consumer and process one message.
func Example_register() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	amqpURL := cmp.Or(os.Getenv("TEST_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")
	queue := fmt.Sprintf("example.register.%d", time.Now().UnixNano())

	// A connection to publish with, and to delete the queue, its DLQ and
	// its delay queues at the end (after the consumer stopped).
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	defer func() {
		_, _ = ch.QueueDelete(queue, false, false, false)
		_, _ = ch.QueueDelete(queue+".dlq", false, false, false)
		for _, tier := range consumer.DefaultRetryTiers {
			_, _ = ch.QueueDelete(inboxtype.RetryQueue(queue, tier), false, false, false)
		}
	}()

	done := make(chan struct{})
	r := consumer.NewRouter()
	consumer.Register(r, queue, inboxtype.HandlerFunc[Payment](func(_ context.Context, m *inboxtype.Message[Payment]) error {
		// With the inbox, this runs inside the transaction that records m.Key.
		fmt.Printf("charge %s: %d cents (key %s, attempt %d)\n", m.Body.OrderID, m.Body.Cents, m.Key, m.Attempt)
		close(done)
		return nil // success: the delivery is acked
	}), &consumer.HandlerOpts{Queue: consumer.QueueOpts{Concurrency: 4}})

	c, err := consumer.New(&consumer.Config{URL: amqpURL, Router: r})
	if err != nil {
		panic(err)
	}
	if err := c.Start(ctx); err != nil { // declares the topology, then consumes
		panic(err)
	}
	fmt.Println("ready:", c.Ready())

	// Publish one message with a publisher confirm.
	if err := ch.Confirm(false); err != nil {
		panic(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
		ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(`{"order_id":"A-1","cents":1299}`),
	})
	if err != nil {
		panic(err)
	}
	if _, err := dc.WaitContext(ctx); err != nil {
		panic(err)
	}

	select {
	case <-done:
	case <-ctx.Done():
		fmt.Println("timed out")
	}
	fmt.Println("stop:", c.Stop(ctx))
	// Output:
	// ready: true
	// charge A-1: 1299 cents (key payment:A-1, attempt 1)
	// stop: <nil>
}
