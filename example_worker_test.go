package inboxmq_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/migrations"
	"github.com/inboxmq/inboxmq/producer"
	"github.com/inboxmq/inboxmq/retry"
)

// Payment is a job whose business identity is its order.
type Payment struct {
	OrderID string `json:"order_id"`
	Cents   int    `json:"cents"`
}

// IdempotencyKey implements inboxtype.Keyer: every copy of the job has
// the same key.
func (p Payment) IdempotencyKey() string { return "payment:" + p.OrderID }

// A worker with one transactional route: the same payment delivered twice
// is charged once.
func Example_worker() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// PostgreSQL: a schema of this example's own, with the inbox tables
	// (package migrations) and a payments table.
	cfg, err := pgxpool.ParseConfig(cmp.Or(os.Getenv("TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"))
	if err != nil {
		panic(err)
	}
	schema := fmt.Sprintf("example_worker_%d", time.Now().UnixNano())
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	if err := inbox.ConfigurePool(cfg); err != nil { // the primary only, across fail-overs
		panic(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		panic(err)
	}
	defer pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
	if err := migrations.Up(ctx, pool); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (order_id text PRIMARY KEY, cents int NOT NULL)`); err != nil {
		panic(err)
	}

	// RabbitMQ: a queue name of this example's own; the worker declares
	// the queue, its DLQ and its delay queues, deleted at the end.
	amqpURL := cmp.Or(os.Getenv("TEST_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")
	queue := fmt.Sprintf("example.payments.%d", time.Now().UnixNano())
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
		queues := []string{queue, queue + ".dlq"}
		for _, tier := range consumer.DefaultRetryTiers {
			queues = append(queues, inboxtype.RetryQueue(queue, tier))
		}
		for _, q := range queues {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
	}()

	// settled reports what each delivery's handling returned: a route's
	// middleware sees the inbox's answer.
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
		Concurrency: 1,
		Middleware:  []inboxtype.Middleware{report},
	})

	w, err := inboxmq.NewWorker(&inboxmq.Config{URL: amqpURL, DB: pool, Routes: routes})
	if err != nil {
		panic(err)
	}
	if err := w.Start(ctx); err != nil { // the inbox table is checked, the topology declared
		panic(err)
	}

	// The same payment, published twice; each Publish returns once the
	// broker confirmed it.
	p, err := producer.New(&producer.Config{URL: amqpURL})
	if err != nil {
		panic(err)
	}
	defer p.Close()
	for range 2 {
		if err := producer.Publish(ctx, p, "", queue, Payment{OrderID: "42", Cents: 1999}, nil); err != nil {
			panic(err)
		}
	}
	for range 2 {
		select {
		case err := <-settled:
			switch {
			case err == nil:
				fmt.Println("handled, then acked")
			case errors.Is(err, retry.ErrDuplicate):
				fmt.Println("duplicate: acked, the handler did not run")
			default:
				fmt.Println("failed:", err)
			}
		case <-ctx.Done():
			fmt.Println("timed out")
		}
	}

	// Graceful: in-flight deliveries finish and are acked, then the
	// background services stop.
	if err := w.Stop(ctx); err != nil {
		fmt.Println(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&n); err != nil {
		panic(err)
	}
	fmt.Println("payments:", n)
	// Output:
	// handled, then acked
	// duplicate: acked, the handler did not run
	// payments: 1
}
