package consumer_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/retry"
)

// Refund is a job: refund an order.
type Refund struct {
	OrderID string `json:"order_id"`
}

// IdempotencyKey implements inboxtype.Keyer.
func (r Refund) IdempotencyKey() string { return "refund:" + r.OrderID }

// deadLetters reports the key of each delivery that the consumer
// dead-lettered, once its copy is in the DLQ.
type deadLetters struct {
	inboxtype.NopObserver
	keys chan string
}

func (d deadLetters) OnOutcome(del *inboxtype.Delivery, out inboxtype.Outcome) {
	if out.Action == inboxtype.ActionDeadLettered {
		d.keys <- del.Key
	}
}

// ReplayDLQ moves dead letters back to their work queue once the cause is
// fixed (inboxctl dlq replay does the same). The body, and so the
// idempotency key, is unchanged, and the attempt starts again at 1; through
// the inbox, replaying a job whose effect was already committed is acked as
// a duplicate.
func ExampleReplayDLQ() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	amqpURL := cmp.Or(os.Getenv("TEST_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")
	queue := fmt.Sprintf("example.refunds.%d", time.Now().UnixNano())

	// A connection to publish and replay with, and to delete the queue, its
	// DLQ and its delay queues at the end (after the consumer stopped).
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

	// The handler refuses refunds until the payment provider is configured.
	var configured atomic.Bool
	refunded := make(chan string, 1)
	r := consumer.NewRouter()
	consumer.Register(r, queue, inboxtype.HandlerFunc[Refund](func(_ context.Context, m *inboxtype.Message[Refund]) error {
		if !configured.Load() {
			return retry.Permanent(errors.New("no payment provider configured"))
		}
		refunded <- fmt.Sprintf("%s (attempt %d, replay %v)", m.Body.OrderID, m.Attempt, m.Headers[inboxtype.HeaderReplayCount])
		return nil
	}), nil)
	dead := deadLetters{keys: make(chan string, 1)}
	c, err := consumer.New(&consumer.Config{URL: amqpURL, Router: r, Observers: []inboxtype.Observer{dead}})
	if err != nil {
		panic(err)
	}
	if err := c.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = c.Stop(context.Background()) }()

	// Publish one message with a publisher confirm.
	if err := ch.Confirm(false); err != nil {
		panic(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
		ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(`{"order_id":"R-5"}`),
	})
	if err != nil {
		panic(err)
	}
	if _, err := dc.WaitContext(ctx); err != nil {
		panic(err)
	}
	select {
	case key := <-dead.keys:
		fmt.Println("dead-lettered:", key)
	case <-ctx.Done():
		fmt.Println("timed out")
		return
	}

	// The cause is fixed: replay the DLQ (here, only the dead letters of
	// that reason).
	configured.Store(true)
	res, err := consumer.ReplayDLQ(ctx, conn, queue, &consumer.ReplayOpts{Reason: "permanent"})
	if err != nil {
		panic(err)
	}
	fmt.Println("replayed:", res.Replayed, "kept:", res.Kept)
	select {
	case job := <-refunded:
		fmt.Println("refunded:", job)
	case <-ctx.Done():
		fmt.Println("timed out")
	}
	// Output:
	// dead-lettered: refund:R-5
	// replayed: 1 kept: 0
	// refunded: R-5 (attempt 1, replay 1)
}
