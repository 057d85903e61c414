package inboxmq_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
)

// A route with RouteOpts.Reply answers requests (RabbitMQ RPC: reply_to and
// correlation_id) with the result its handler stored in the transaction.
// A duplicate request gets the same bytes, and the handler does not run
// again.
func Example_reply() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, drop := exampleDB(ctx, "reply", `CREATE TABLE payments (order_id text PRIMARY KEY, cents int NOT NULL)`)
	defer drop()
	b := newExampleBroker("reply")
	defer b.Close()

	var runs atomic.Int32 // the handler's runs
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.Queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[Payment]) error {
		if _, err := tx.Exec(ctx, `INSERT INTO payments (order_id, cents) VALUES ($1, $2)`, msg.Body.OrderID, msg.Body.Cents); err != nil {
			return err
		}
		// Stored with the inbox row, in the same transaction.
		return msg.SetResult(map[string]any{"order_id": msg.Body.OrderID, "status": "charged", "run": runs.Add(1)})
	}, &inboxmq.RouteOpts{Concurrency: 1, Reply: true}) // one at a time: the replies come in order
	w, err := inboxmq.NewWorker(&inboxmq.Config{URL: b.URL, DB: pool, Routes: routes})
	if err != nil {
		panic(err)
	}
	if err := w.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = w.Stop(context.Background()) }()

	// The client: a reply queue of its own, and the same request twice,
	// each with its own correlation id.
	replyTo, replies := b.Subscribe(ctx, "", "")
	for _, corr := range []string{"request-1", "request-2"} {
		b.Publish(ctx, "", b.Queue, amqp.Publishing{
			ContentType: "application/json", Body: []byte(`{"order_id":"42","cents":1999}`),
			ReplyTo: replyTo, CorrelationId: corr,
		})
	}
	for range 2 {
		select {
		case d := <-replies:
			fmt.Println(d.CorrelationId, string(d.Body))
		case <-ctx.Done():
			fmt.Println("timed out")
		}
	}
	// Output:
	// request-1 {"order_id":"42","run":1,"status":"charged"}
	// request-2 {"order_id":"42","run":1,"status":"charged"}
}
