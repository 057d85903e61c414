package inboxmq_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/outbox"
	"github.com/inboxmq/inboxmq/retry"
)

// A handler that publishes does so through the outbox: outbox.Enqueue
// writes the message in the handler's transaction, so it exists only if
// the business write commits, and the worker's relay publishes it after the
// commit. A duplicate delivery enqueues nothing: the event goes out once.
func Example_outbox() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, drop := exampleDB(ctx, "outbox", `CREATE TABLE payments (order_id text PRIMARY KEY, cents int NOT NULL)`)
	defer drop()
	b := newExampleBroker("outbox")
	events := b.Queue + ".events"
	defer b.Close(events)

	settled := make(chan error, 2) // what each delivery's handling returned
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.Queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[Payment]) error {
		if _, err := tx.Exec(ctx, `INSERT INTO payments (order_id, cents) VALUES ($1, $2)`, msg.Body.OrderID, msg.Body.Cents); err != nil {
			return err
		}
		return outbox.Enqueue(ctx, tx, outbox.Message{
			Exchange: events, RoutingKey: "payment.charged",
			IdempotencyKey: msg.Key, // the message id derives from it: a relay crash repeats only that id
			ContentType:    "application/json", Body: fmt.Appendf(nil, `{"order_id":%q}`, msg.Body.OrderID),
		})
	}, &inboxmq.RouteOpts{Concurrency: 1, Middleware: []inboxtype.Middleware{reportTo(settled)}})
	w, err := inboxmq.NewWorker(&inboxmq.Config{
		URL: b.URL, DB: pool, Routes: routes,
		Exchanges: []string{events}, // declared by Start, before anything is consumed
	})
	if err != nil {
		panic(err)
	}
	if err := w.Start(ctx); err != nil {
		panic(err)
	}
	_, received := b.Subscribe(ctx, events, "payment.charged")

	// The same payment, delivered twice.
	for range 2 {
		b.Publish(ctx, "", b.Queue, amqp.Publishing{ContentType: "application/json", Body: []byte(`{"order_id":"42","cents":1999}`)})
	}
	for range 2 {
		if err := <-settled; errors.Is(err, retry.ErrDuplicate) {
			fmt.Println("duplicate: acked, nothing enqueued")
		} else {
			fmt.Println("handled:", err)
		}
	}
	select {
	case d := <-received:
		fmt.Println("event:", string(d.Body), "key:", d.Headers[inboxtype.HeaderIdempotencyKey])
	case <-ctx.Done():
		fmt.Println("timed out")
	}
	if err := w.Stop(ctx); err != nil {
		fmt.Println(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM inboxmq_outbox`).Scan(&n); err != nil {
		panic(err)
	}
	fmt.Println("outbox messages:", n)
	// Output:
	// handled: <nil>
	// duplicate: acked, nothing enqueued
	// event: {"order_id":"42"} key: payment:42
	// outbox messages: 1
}
