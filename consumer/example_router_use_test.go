package consumer_test

import (
	"context"
	"fmt"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// Router-wide middleware wraps every handler, outermost first. It sees the
// untyped delivery before decoding; it only returns an error and never acks.
func ExampleRouter_Use() {
	queue, cleanup := exampleQueue("middleware")
	defer cleanup()
	ctx := context.Background()

	trace := func(name string) inboxtype.Middleware {
		return func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
			return func(ctx context.Context, d *inboxtype.Delivery) error {
				fmt.Printf("%s: before (attempt %d)\n", name, d.Attempt)
				err := next(ctx, d)
				fmt.Printf("%s: after (key %s, err %v)\n", name, d.Key, err)
				return err
			}
		}
	}
	done := make(chan struct{})
	r := consumer.NewRouter()
	r.Use(trace("outer"), trace("inner"))
	consumer.Register(r, queue, inboxtype.HandlerFunc[Payment](func(_ context.Context, m *inboxtype.Message[Payment]) error {
		fmt.Println("handler:", m.Body.OrderID)
		defer close(done)
		return nil
	}), nil)

	c, err := consumer.New(&consumer.Config{URL: testenv.AMQPURL(), Router: r})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := c.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	if err := examplePublish(queue, `{"order_id":"D-9","cents":42}`); err != nil {
		fmt.Println(err)
	}
	wait(done)
	_ = c.Stop(ctx)
	// Output:
	// outer: before (attempt 1)
	// inner: before (attempt 1)
	// handler: D-9
	// inner: after (key payment:D-9, err <nil>)
	// outer: after (key payment:D-9, err <nil>)
}
