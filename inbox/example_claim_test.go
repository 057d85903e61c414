package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

func Example_claim() {
	ctx := context.Background()
	pool, cleanup := exampleDB(ctx, "claim")
	defer cleanup()
	store, err := inbox.NewStore(ctx, pool, nil)
	if err != nil {
		panic(err)
	}

	charges := 0
	charge := func(_ context.Context, idempotencyKey string, cents int) (string, error) {
		charges++ // the outside effect; the gateway dedupes on idempotencyKey
		return "ch_" + idempotencyKey, nil
	}
	h := inbox.ClaimHandler(store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[Payment]) error {
		// A recovery point: a retry after a crash past this line skips the
		// call and gets the recorded result.
		res, err := c.Step(ctx, "charge", func(ctx context.Context) (any, error) {
			return charge(ctx, c.Key, msg.Body.Cents)
		})
		if err != nil {
			return err
		}
		fmt.Println("charged:", string(res))
		// The business writes and the fenced completion, in one transaction.
		return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO payments (order_id, cents) VALUES ($1, $2)`, msg.Body.OrderID, msg.Body.Cents)
			return err
		})
	}, nil)

	p := Payment{OrderID: "7", Cents: 500}
	fmt.Println("first delivery:", h.Handle(ctx, exampleMsg("charges", p)))
	err = h.Handle(ctx, exampleMsg("charges", p))
	fmt.Println("redelivery is a duplicate:", errors.Is(err, retry.ErrDuplicate))
	fmt.Println("gateway calls:", charges)
	// Output:
	// charged: "ch_payment:7"
	// first delivery: <nil>
	// redelivery is a duplicate: true
	// gateway calls: 1
}

// Claim mode with group commit: the completions of deliveries handled at
// the same time share one transaction and one COMMIT, each callback in its
// own savepoint.
func Example_claimGroupCommit() {
	ctx := context.Background()
	pool, cleanup := exampleDB(ctx, "claim_group")
	defer cleanup()
	store, err := inbox.NewStore(ctx, pool, nil)
	if err != nil {
		panic(err)
	}

	var mu sync.Mutex
	txids := map[int64]bool{}
	h := inbox.ClaimHandler(store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[Payment]) error {
		// (the gateway call with c.Key as Idempotency-Key goes here)
		return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error {
			var txid int64
			if err := tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&txid); err != nil {
				return err
			}
			mu.Lock()
			txids[txid] = true
			mu.Unlock()
			_, err := tx.Exec(ctx, `INSERT INTO payments (order_id, cents) VALUES ($1, $2)`, msg.Body.OrderID, msg.Body.Cents)
			return err
		})
	}, &inbox.ClaimOpts{GroupCommit: &inbox.GroupCommit{
		MaxBatch: 4,                // at most 4 completions per transaction
		MaxWait:  10 * time.Second, // the first waits up to this for the others (here: until 4 arrived)
	}})

	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			if err := h.Handle(ctx, exampleMsg("charges", Payment{OrderID: fmt.Sprint(i), Cents: 100})); err != nil {
				fmt.Println(err)
			}
		})
	}
	wg.Wait()
	var payments int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&payments); err != nil {
		panic(err)
	}
	fmt.Println("payments:", payments, "transactions:", len(txids))
	// Output:
	// payments: 4 transactions: 1
}
