package inboxtest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtest"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/migrations"
)

// Order is a payment request; its business identity is the order id.
type Order struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

// IdempotencyKey implements inboxtype.Keyer.
func (o Order) IdempotencyKey() string { return "payment:" + o.OrderID }

// recordPayment books the payment in the inbox's transaction.
func recordPayment(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[Order]) error {
	_, err := tx.Exec(ctx, `INSERT INTO ledger_entries (order_id, amount_cents) VALUES ($1, $2)`,
		msg.Body.OrderID, msg.Body.AmountCents)
	return err
}

// A payment handler checked against every duplicate and crash scenario. In
// a real test, call inboxtest.Run(t, subject) instead of Check.
func Example_payment() {
	ctx := context.Background()
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "example_inboxtest_" + hex.EncodeToString(b[:])
	admin, err := pgxpool.New(ctx, testenv.DatabaseURL())
	if err != nil {
		panic(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		panic(err)
	}
	defer admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck

	// The inbox store's pool, instrumented so the harness can fail a COMMIT.
	faults := &inboxtest.Faults{}
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL())
	if err != nil {
		panic(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	faults.Instrument(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := migrations.Up(ctx, pool); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger_entries (order_id text NOT NULL, amount_cents bigint NOT NULL)`); err != nil {
		panic(err)
	}
	// The worker as the program builds it; the kit does not start it.
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, "payments", recordPayment, nil)
	w, err := inboxmq.NewWorker(&inboxmq.Config{URL: testenv.AMQPURL(), DB: pool, Routes: routes, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}

	results, err := inboxtest.Check(ctx, inboxtest.Subject{
		Worker: w,
		Queue:  "payments",
		Message: func(n int) []byte {
			return fmt.Appendf(nil, `{"order_id":"order-%d","amount_cents":1250}`, n)
		},
		Effects: func(ctx context.Context, key string) (int, error) {
			var n int
			err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE 'payment:' || order_id = $1`, key).Scan(&n)
			return n, err
		},
		Faults: faults,
	})
	if err != nil {
		panic(err)
	}
	for _, r := range results {
		fmt.Printf("%-30s effects=%d ok=%v\n", r.Scenario, r.Effects, r.OK())
	}
	// Output:
	// sequential duplicates          effects=1 ok=true
	// concurrent duplicates          effects=1 ok=true
	// crash before commit            effects=1 ok=true
	// crash between commit and ack   effects=1 ok=true
	// lock loss mid-handler          effects=1 ok=true
	// redis flush between copies     effects=1 ok=true
}
