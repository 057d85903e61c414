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

// Order is a job whose business identity is its order id.
type Order struct {
	OrderID string `json:"order_id"`
}

// IdempotencyKey implements inboxtype.Keyer.
func (o Order) IdempotencyKey() string { return "order:" + o.OrderID }

// Router-wide middleware wraps every handler, outermost first. It sees the
// untyped delivery before decoding; it only returns an error and never acks.
func ExampleRouter_Use() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	amqpURL := cmp.Or(os.Getenv("TEST_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")
	queue := fmt.Sprintf("example.middleware.%d", time.Now().UnixNano())

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
	consumer.Register(r, queue, inboxtype.HandlerFunc[Order](func(_ context.Context, m *inboxtype.Message[Order]) error {
		fmt.Println("handler:", m.Body.OrderID)
		defer close(done)
		return nil
	}), nil)

	c, err := consumer.New(&consumer.Config{URL: amqpURL, Router: r})
	if err != nil {
		panic(err)
	}
	if err := c.Start(ctx); err != nil {
		panic(err)
	}

	// Publish one message with a publisher confirm.
	if err := ch.Confirm(false); err != nil {
		panic(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
		ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(`{"order_id":"D-9"}`),
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
	_ = c.Stop(ctx)
	// Output:
	// outer: before (attempt 1)
	// inner: before (attempt 1)
	// handler: D-9
	// inner: after (key order:D-9, err <nil>)
	// outer: after (key order:D-9, err <nil>)
}
