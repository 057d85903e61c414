package inboxmq_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
)

// AccountEvent is the Seq-th event of an account.
type AccountEvent struct {
	Account string `json:"account"`
	Seq     int    `json:"seq"`
}

// IdempotencyKey implements inboxtype.Keyer.
func (e AccountEvent) IdempotencyKey() string { return fmt.Sprintf("%s:%d", e.Account, e.Seq) }

// An ordered route (RouteOpts.Ordered): producers publish to the route's
// exchange, named after the queue, with the ordering key (here the account)
// as routing key, and the events of one account are handled one at a time,
// in publish order, by however many workers, while other accounts run in
// parallel.
func Example_orderedRoute() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, drop := exampleDB(ctx, "ordered")
	defer drop()
	b := newExampleBroker("ordered")
	defer b.Close()

	const events = 5
	applied := make(chan AccountEvent, events)
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.Queue, func(_ context.Context, _ pgx.Tx, msg *inboxtype.Message[AccountEvent]) error {
		applied <- msg.Body // … apply it to the account with the transaction …
		return nil
	}, &inboxmq.RouteOpts{Concurrency: 8, Ordered: &inboxmq.OrderedOpts{Shards: 4}})
	w, err := inboxmq.NewWorker(&inboxmq.Config{URL: b.URL, DB: pool, Routes: routes})
	if err != nil {
		panic(err)
	}
	if err := w.Start(ctx); err != nil { // declares the exchange and its shard queues
		// Without the broker's rabbitmq_consistent_hash_exchange plugin the
		// error says how to enable it (`make up` does, for the tests).
		fmt.Println("start:", err)
		return
	}
	defer func() { _ = w.Stop(context.Background()) }()

	for seq := 1; seq <= events; seq++ {
		b.Publish(ctx, b.Queue, "acct-7", amqp.Publishing{
			ContentType: "application/json", Body: fmt.Appendf(nil, `{"account":"acct-7","seq":%d}`, seq),
		})
	}
	for range events {
		select {
		case e := <-applied:
			fmt.Println(e.Account, e.Seq)
		case <-ctx.Done():
			fmt.Println("timed out")
		}
	}
	// Output:
	// acct-7 1
	// acct-7 2
	// acct-7 3
	// acct-7 4
	// acct-7 5
}
