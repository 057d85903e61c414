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

// LedgerEvent is the Seq-th event of an account.
type LedgerEvent struct {
	Account string `json:"account"`
	Seq     int    `json:"seq"`
}

// IdempotencyKey implements inboxtype.Keyer.
func (e LedgerEvent) IdempotencyKey() string { return fmt.Sprintf("%s:%d", e.Account, e.Seq) }

// An ordered route: the events of one account apply in publish order,
// even though the handler runs 8 deliveries at once.
func Example_ordered() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	amqpURL := cmp.Or(os.Getenv("TEST_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")
	queue := fmt.Sprintf("example.ordered.%d", time.Now().UnixNano())
	const shards = 4

	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	defer func() { // the route's topology, once the consumer stopped
		for i := range shards {
			_, _ = ch.QueueDelete(consumer.ShardQueueName(queue, i), false, false, false)
		}
		_, _ = ch.QueueDelete(queue+".members", false, false, false)
		_, _ = ch.QueueDelete(queue+".dlq", false, false, false)
		_ = ch.ExchangeDelete(queue, false, false)
	}()

	const events = 5
	applied := make(chan LedgerEvent, events)
	r := consumer.NewRouter()
	consumer.Register(r, queue, inboxtype.HandlerFunc[LedgerEvent](func(_ context.Context, m *inboxtype.Message[LedgerEvent]) error {
		applied <- m.Body
		return nil
	}), &consumer.HandlerOpts{
		Queue:   consumer.QueueOpts{Concurrency: 8},
		Ordered: &consumer.OrderedOpts{Shards: shards},
	})
	c, err := consumer.New(&consumer.Config{URL: amqpURL, Router: r})
	if err != nil {
		panic(err)
	}
	if err := c.Start(ctx); err != nil { // declares the exchange and the shards
		// Without the rabbitmq_consistent_hash_exchange plugin the error
		// says how to enable it (`make up` enables it for the tests).
		fmt.Println("start:", err)
		return
	}

	// Publish to the route's exchange (named after the queue) with the
	// account as routing key: the ordering key.
	if err := ch.Confirm(false); err != nil {
		panic(err)
	}
	for seq := 1; seq <= events; seq++ {
		body := fmt.Appendf(nil, `{"account":"acct-7","seq":%d}`, seq)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, queue, "acct-7", true, false, amqp.Publishing{
			ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body,
		})
		if err != nil {
			panic(err)
		}
		if _, err := dc.WaitContext(ctx); err != nil {
			panic(err)
		}
	}
	for range events {
		select {
		case e := <-applied:
			fmt.Println(e.Account, e.Seq)
		case <-ctx.Done():
			fmt.Println("timed out")
		}
	}
	fmt.Println("stop:", c.Stop(ctx))
	// Output:
	// acct-7 1
	// acct-7 2
	// acct-7 3
	// acct-7 4
	// acct-7 5
	// stop: <nil>
}
