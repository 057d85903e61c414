package inbox_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/migrations"
	"github.com/inboxmq/inboxmq/retry"
)

// Charge is a job with an effect outside PostgreSQL: a call to a payment
// gateway.
type Charge struct {
	OrderID string `json:"order_id"`
	Cents   int    `json:"cents"`
}

// IdempotencyKey is the key the inbox claims, and the Idempotency-Key sent
// to the gateway.
func (c Charge) IdempotencyKey() string { return "charge:" + c.OrderID }

// Claim mode: the gateway call happens outside the database, once per key
// (a retry after a crash repeats it with the same key), and the business
// write commits with the claim's fenced completion.
func Example_claim() {
	ctx := context.Background()

	// A schema of this example's own, with the inbox tables (package
	// migrations) and a charges table.
	cfg, err := pgxpool.ParseConfig(cmp.Or(os.Getenv("TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"))
	if err != nil {
		panic(err)
	}
	schema := fmt.Sprintf("example_claim_%d", time.Now().UnixNano())
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
	if _, err := pool.Exec(ctx, `CREATE TABLE charges (order_id text PRIMARY KEY, gateway_id text NOT NULL)`); err != nil {
		panic(err)
	}
	store, err := inbox.NewStore(pool, nil)
	if err == nil {
		err = store.Check(ctx)
	}
	if err != nil {
		panic(err)
	}

	calls := 0
	gateway := func(_ context.Context, idempotencyKey string, cents int) (string, error) {
		calls++ // the outside effect; the gateway dedupes on idempotencyKey
		return "ch_" + idempotencyKey, nil
	}
	h := inbox.ClaimHandler(store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[Charge]) error {
		// A recovery point: a retry after a crash past this line skips the
		// call and gets the recorded result.
		res, err := c.Step(ctx, "charge", func(ctx context.Context) (any, error) {
			return gateway(ctx, c.Key, msg.Body.Cents)
		})
		if err != nil {
			return err
		}
		fmt.Println("charged:", string(res))
		// The business write and the fenced completion, in one transaction.
		return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO charges (order_id, gateway_id) VALUES ($1, $2)`, msg.Body.OrderID, string(res))
			return err
		})
	}, nil, nil)

	// In a worker: consumer.Register(router, "charges", h, nil). Here two
	// copies of one job are handed over directly.
	job := Charge{OrderID: "7", Cents: 500}
	msg := &inboxtype.Message[Charge]{Namespace: "charges", Key: job.IdempotencyKey(), Body: job, Attempt: 1}
	fmt.Println("first delivery:", h.Handle(ctx, msg))
	err = h.Handle(ctx, msg)
	fmt.Println("redelivery is a duplicate:", errors.Is(err, retry.ErrDuplicate))
	fmt.Println("gateway calls:", calls)
	// Output:
	// charged: "ch_charge:7"
	// first delivery: <nil>
	// redelivery is a duplicate: true
	// gateway calls: 1
}

// Claim mode with group commit: the completions of deliveries handled at
// the same time share one transaction and one commit, each callback in its
// own savepoint.
func Example_claimGroupCommit() {
	ctx := context.Background()

	// A schema of this example's own, with the inbox tables (package
	// migrations) and a charges table.
	cfg, err := pgxpool.ParseConfig(cmp.Or(os.Getenv("TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"))
	if err != nil {
		panic(err)
	}
	schema := fmt.Sprintf("example_claim_group_%d", time.Now().UnixNano())
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
	if _, err := pool.Exec(ctx, `CREATE TABLE charges (order_id text PRIMARY KEY, txid bigint NOT NULL)`); err != nil {
		panic(err)
	}
	store, err := inbox.NewStore(pool, nil)
	if err == nil {
		err = store.Check(ctx)
	}
	if err != nil {
		panic(err)
	}

	h := inbox.ClaimHandler(store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[Charge]) error {
		// (the gateway call with c.Key as Idempotency-Key goes here)
		return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO charges (order_id, txid) VALUES ($1, txid_current())`, msg.Body.OrderID)
			return err
		})
	}, &inbox.GroupCommit{
		MaxBatch: 4,                // at most 4 completions per transaction
		MaxWait:  10 * time.Second, // the first waits up to this for the others (here: until 4 arrived)
	}, nil)

	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			job := Charge{OrderID: fmt.Sprint(i), Cents: 100}
			msg := &inboxtype.Message[Charge]{Namespace: "charges", Key: job.IdempotencyKey(), Body: job, Attempt: 1}
			if err := h.Handle(ctx, msg); err != nil {
				fmt.Println(err)
			}
		})
	}
	wg.Wait()
	var charges, transactions int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT txid) FROM charges`).Scan(&charges, &transactions); err != nil {
		panic(err)
	}
	fmt.Println("charges:", charges, "transactions:", transactions)
	// Output:
	// charges: 4 transactions: 1
}
