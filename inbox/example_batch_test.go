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

// A batch handler: it queues the payment and its ledger entry instead of
// running them, and the claim of the key, the two writes and the result
// reach PostgreSQL in one round trip, as one transaction.
func ExampleBatchHandler() {
	ctx := context.Background()

	// A schema of this example's own, with the inbox tables (package
	// migrations), a payments table and a ledger.
	cfg, err := pgxpool.ParseConfig(cmp.Or(os.Getenv("TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"))
	if err != nil {
		panic(err)
	}
	schema := fmt.Sprintf("example_batch_%d", time.Now().UnixNano())
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
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (order_id text PRIMARY KEY, cents int NOT NULL);
		CREATE TABLE ledger (id bigserial PRIMARY KEY, order_id text NOT NULL, cents int NOT NULL)`); err != nil {
		panic(err)
	}

	store, err := inbox.NewStore(pool, nil)

	if err == nil {

		err = store.Check(ctx)

	}
	if err != nil {
		panic(err)
	}
	// The handler only builds the batch: it runs before the key is
	// claimed, and its writes commit with the claim or not at all.
	h := inbox.BatchHandler(store, func(_ context.Context, b *pgx.Batch, msg *inboxtype.Message[Payment]) error {
		p := msg.Body
		b.Queue(`INSERT INTO payments (order_id, cents) VALUES ($1, $2)`, p.OrderID, p.Cents)
		b.Queue(`INSERT INTO ledger (order_id, cents) VALUES ($1, $2)`, p.OrderID, p.Cents)
		return msg.SetResult("paid " + p.OrderID) // handed to every copy
	}, nil)

	p := Payment{OrderID: "42", Cents: 1999}
	msg := &inboxtype.Message[Payment]{Namespace: "payments", Key: p.IdempotencyKey(), Body: p, Attempt: 1}
	fmt.Println("first delivery:", h.Handle(ctx, msg))
	dup := &inboxtype.Message[Payment]{Namespace: "payments", Key: p.IdempotencyKey(), Body: p, Attempt: 1}
	err = h.Handle(ctx, dup)
	fmt.Println("redelivery is a duplicate:", errors.Is(err, retry.ErrDuplicate))
	fmt.Println("its result:", string(dup.Result()))

	var payments, entries int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM payments), (SELECT count(*) FROM ledger)`).Scan(&payments, &entries); err != nil {
		panic(err)
	}
	fmt.Println("payments:", payments, "ledger entries:", entries)
	// Output:
	// first delivery: <nil>
	// redelivery is a duplicate: true
	// its result: "paid 42"
	// payments: 1 ledger entries: 1
}
