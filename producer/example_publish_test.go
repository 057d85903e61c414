package producer_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/producer"
)

// Payment is the message: its IdempotencyKey is the business identity that
// the consumer's inbox deduplicates on.
type Payment struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

func (p Payment) IdempotencyKey() string { return "payment:" + p.OrderID }

// Example_publish publishes a typed message and waits for the broker's
// confirm; a message that no queue would get is an error.
func Example_publish() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	amqpURL := cmp.Or(os.Getenv("TEST_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")

	// A queue of this example's own (the consumer declares it in a real
	// deployment), deleted at the end.
	queue := fmt.Sprintf("example.producer.%d", time.Now().UnixNano())
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		panic(err)
	}
	defer ch.QueueDelete(queue, false, false, false)

	p, err := producer.New(&producer.Config{URL: amqpURL})
	if err != nil {
		panic(err)
	}
	defer p.Close()

	// Confirmed when Publish returns nil: the message is on the queue.
	if err := producer.Publish(ctx, p, "", queue, Payment{OrderID: "42", AmountCents: 1999}, nil); err != nil {
		panic(err)
	}
	// A routing key no queue is bound to: an error, not a silent drop.
	err = producer.Publish(ctx, p, "", queue+".typo", Payment{OrderID: "43", AmountCents: 500}, nil)
	fmt.Println("unroutable:", errors.Is(err, producer.ErrUnroutable))

	d, ok, err := ch.Get(queue, true)
	if err != nil || !ok {
		panic(fmt.Sprint("no message: ", err))
	}
	fmt.Println("body:", string(d.Body))
	fmt.Println("key header:", d.Headers[inboxtype.HeaderIdempotencyKey])
	fmt.Println("persistent:", d.DeliveryMode == amqp.Persistent)
	// Output:
	// unroutable: true
	// body: {"order_id":"42","amount_cents":1999}
	// key header: payment:42
	// persistent: true
}
