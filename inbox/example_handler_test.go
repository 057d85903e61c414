package inbox_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/migrations"
	"github.com/inboxmq/inboxmq/retry"
)

// Payment is a job whose business identity is its order.
type Payment struct {
	OrderID string `json:"order_id"`
	Cents   int    `json:"cents"`
}

// IdempotencyKey is the key the inbox dedupes on.
func (p Payment) IdempotencyKey() string { return "payment:" + p.OrderID }

// A transactional handler: the business write and the inbox row commit in
// one transaction, so a redelivery finds the key completed and the write is
// not made twice.
func Example_handler() {
	ctx := context.Background()

	// A schema of this example's own, with the inbox tables (package
	// migrations) and a payments table.
	cfg, err := pgxpool.ParseConfig(cmp.Or(os.Getenv("TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"))
	if err != nil {
		panic(err)
	}
	schema := fmt.Sprintf("example_handler_%d", time.Now().UnixNano())
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
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

	store, err := inbox.NewStore(pool, nil)

	if err == nil {

		err = store.Check(ctx)

	}
	if err != nil {
		panic(err)
	}
	// The business write uses the inbox's transaction: both commit, or
	// neither does.
	h := inbox.Handler(store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[Payment]) error {
		_, err := tx.Exec(ctx, `INSERT INTO payments (order_id, cents) VALUES ($1, $2)`, msg.Body.OrderID, msg.Body.Cents)
		return err
	}, nil)
	// In a worker: consumer.Register(router, "payments", h, nil), which
	// builds each message from a delivery. Here two copies are handed over
	// directly.
	p := Payment{OrderID: "42", Cents: 1999}
	msg := &inboxtype.Message[Payment]{Namespace: "payments", Key: p.IdempotencyKey(), Body: p, Attempt: 1}
	fmt.Println("first delivery:", h.Handle(ctx, msg))
	err = h.Handle(ctx, msg)
	fmt.Println("redelivery is a duplicate:", errors.Is(err, retry.ErrDuplicate))

	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&n); err != nil {
		panic(err)
	}
	rec, err := store.Get(ctx, "payments", "payment:42")
	if err != nil {
		panic(err)
	}
	fmt.Println("payments:", n, "inbox:", rec.Status)
	// Output:
	// first delivery: <nil>
	// redelivery is a duplicate: true
	// payments: 1 inbox: completed
}
