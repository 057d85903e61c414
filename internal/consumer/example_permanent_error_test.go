package consumer_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/retry"
)

// Charge is a job: charge a card for an order.
type Charge struct {
	OrderID string `json:"order_id"`
	Cents   int    `json:"cents"`
}

// IdempotencyKey implements inboxtype.Keyer.
func (c Charge) IdempotencyKey() string { return "charge:" + c.OrderID }

// actionObserver reports each delivery's final action, once the consumer
// has carried it out.
type actionObserver struct {
	inboxtype.NopObserver
	actions chan inboxtype.Action
}

func (o actionObserver) OnOutcome(_ *inboxtype.Delivery, out inboxtype.Outcome) {
	o.actions <- out.Action
}

// A permanent error dead-letters the message at once: a confirmed copy goes
// to "<queue>.dlq" with the reason in x-error, then the original is acked.
func Example_permanentError() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	amqpURL := cmp.Or(os.Getenv("TEST_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")
	queue := fmt.Sprintf("example.charges.%d", time.Now().UnixNano())

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

	r := consumer.NewRouter()
	consumer.Register(r, queue, inboxtype.HandlerFunc[Charge](func(context.Context, *inboxtype.Message[Charge]) error {
		return retry.Permanent(errors.New("card declined")) // no retry can fix this
	}), nil)
	obs := actionObserver{actions: make(chan inboxtype.Action, 1)}
	c, err := consumer.New(&consumer.Config{URL: amqpURL, Router: r, Observers: []inboxtype.Observer{obs}})
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
		ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(`{"order_id":"B-7","cents":500}`),
	})
	if err != nil {
		panic(err)
	}
	if _, err := dc.WaitContext(ctx); err != nil {
		panic(err)
	}

	select {
	case action := <-obs.actions:
		fmt.Println("action:", action)
	case <-ctx.Done():
		fmt.Println("timed out")
		return
	}
	dead, ok, err := ch.Get(queue+".dlq", true)
	if err != nil {
		panic(err)
	}
	fmt.Println("in DLQ:", ok)
	fmt.Println("x-error:", dead.Headers[inboxtype.HeaderError])
	fmt.Println("x-idempotency-key:", dead.Headers[inboxtype.HeaderIdempotencyKey])
	fmt.Println("body:", string(dead.Body))
	// Output:
	// action: dead_lettered
	// in DLQ: true
	// x-error: permanent: card declined
	// x-idempotency-key: charge:B-7
	// body: {"order_id":"B-7","cents":500}
}
