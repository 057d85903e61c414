package inboxmq_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// A worker with one transactional route: the same payment delivered twice
// is charged once.
func Example_worker() {
	ctx := context.Background()
	pool, dropSchema := exampleDB(ctx, "worker") // the migrations applied, a payments table
	defer dropSchema()
	queue, deleteQueue := exampleQueue("payments")
	defer deleteQueue()

	// settled reports what each delivery's handling returned (a
	// middleware of the route sees the inbox's answer).
	settled := make(chan error, 2)
	report := func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
		return func(ctx context.Context, d *inboxtype.Delivery) error {
			err := next(ctx, d)
			settled <- err
			return err
		}
	}

	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[Payment]) error {
		// Runs once per key, in the transaction that records it.
		_, err := tx.Exec(ctx, `INSERT INTO payments (order_id, cents) VALUES ($1, $2)`, msg.Body.OrderID, msg.Body.Cents)
		return err
	}, &inboxmq.RouteOpts{
		Queue:      consumer.QueueOpts{Concurrency: 1},
		Middleware: []inboxtype.Middleware{report},
	})

	w, err := inboxmq.NewWorker(&inboxmq.Config{
		URL:    testenv.AMQPURL(),
		DB:     pool,
		Routes: routes,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := w.Start(ctx); err != nil { // the inbox table is checked, the topology declared
		fmt.Println(err)
		return
	}
	for range 2 {
		if err := examplePublish(queue, `{"order_id":"42","cents":1999}`); err != nil {
			fmt.Println(err)
		}
	}
	first, _ := wait(settled)
	second, _ := wait(settled)
	fmt.Println("first delivery:", first)
	fmt.Println("second delivery is a duplicate:", errors.Is(second, retry.ErrDuplicate))
	// Graceful: in-flight deliveries finish and are acked, then the
	// background services stop.
	if err := w.Stop(ctx); err != nil {
		fmt.Println(err)
	}

	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&n); err != nil {
		fmt.Println(err)
	}
	fmt.Println("payments:", n)
	// Output:
	// first delivery: <nil>
	// second delivery is a duplicate: true
	// payments: 1
}
