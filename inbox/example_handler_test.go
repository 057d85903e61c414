package inbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/testenv"
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

// exampleDB opens a pool on a fresh schema with the inbox migrated and a
// payments table, and returns it with a function dropping the schema.
func exampleDB(ctx context.Context, name string) (*pgxpool.Pool, func()) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "example_" + name + "_" + hex.EncodeToString(b[:])
	admin, err := pgxpool.New(ctx, testenv.DatabaseURL())
	if err != nil {
		panic(err)
	}
	drop := func() {
		_, _ = admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	}
	drop()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		panic(err)
	}
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL())
	if err != nil {
		panic(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	if err := migrations.Up(ctx, pool); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (order_id text PRIMARY KEY, cents int NOT NULL)`); err != nil {
		panic(err)
	}
	return pool, func() { pool.Close(); drop(); admin.Close() }
}

// exampleMsg builds the message the consumer would hand to the handler.
func exampleMsg(consumerName string, p Payment) *inboxtype.Message[Payment] {
	return &inboxtype.Message[Payment]{Key: p.IdempotencyKey(), Namespace: consumerName, Body: p, Attempt: 1}
}

func Example_handler() {
	ctx := context.Background()
	pool, cleanup := exampleDB(ctx, "handler")
	defer cleanup()

	store, err := inbox.NewStore(ctx, pool, nil)
	if err != nil {
		panic(err)
	}
	// The business write uses the inbox's transaction: both commit, or
	// neither does.
	h := inbox.Handler(store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[Payment]) error {
		_, err := tx.Exec(ctx, `INSERT INTO payments (order_id, cents) VALUES ($1, $2)`, msg.Body.OrderID, msg.Body.Cents)
		return err
	}, nil)
	// In a worker: consumer.Register(router, "payments", h, nil).

	p := Payment{OrderID: "42", Cents: 1999}
	fmt.Println("first delivery:", h.Handle(ctx, exampleMsg("payments", p)))
	err = h.Handle(ctx, exampleMsg("payments", p))
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
