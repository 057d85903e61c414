package consumer_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// Payment is the payload of the examples: its business identity is the
// order id.
type Payment struct {
	OrderID string `json:"order_id"`
	Cents   int    `json:"cents"`
}

// IdempotencyKey implements inboxtype.Keyer.
func (p Payment) IdempotencyKey() string { return "payment:" + p.OrderID }

// exampleQueue returns a unique queue name and a function that deletes the
// queue and its DLQ and tiers.
func exampleQueue(name string) (string, func()) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	q := "example." + name + "." + hex.EncodeToString(b[:])
	return q, func() {
		conn, err := amqp.Dial(testenv.AMQPURL())
		if err != nil {
			return
		}
		defer conn.Close()
		names := []string{q, q + ".dlq"}
		for _, tier := range consumer.DefaultRetryTiers {
			names = append(names, consumer.RetryQueueName(q, tier))
		}
		for _, n := range names {
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(n, false, false, false)
				_ = ch.Close()
			}
		}
	}
}

// examplePublish publishes body to queue with a publisher confirm.
func examplePublish(queue, body string) error {
	conn, err := amqp.Dial(testenv.AMQPURL())
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
		ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(body),
	})
	if err != nil {
		return err
	}
	_, err = dc.WaitContext(ctx)
	return err
}

// exampleGet fetches (and acks) one message from queue.
func exampleGet(queue string) (amqp.Delivery, bool) {
	conn, err := amqp.Dial(testenv.AMQPURL())
	if err != nil {
		return amqp.Delivery{}, false
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return amqp.Delivery{}, false
	}
	m, ok, err := ch.Get(queue, true)
	return m, ok && err == nil
}

// wait waits for ch or gives up after 30s.
func wait[T any](ch <-chan T) (T, bool) {
	select {
	case v := <-ch:
		return v, true
	case <-time.After(30 * time.Second):
		var zero T
		return zero, false
	}
}
