package chaos_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/chaos"
	"github.com/inboxmq/inboxmq/internal/pgtest"
)

// paymentTables are the payment-worker's business tables, filled by hand
// here so the checker is tested without any worker.
const paymentTables = `
CREATE TABLE payments (order_id text PRIMARY KEY, amount_cents bigint NOT NULL, currency char(3) NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE ledger_entries (id bigserial PRIMARY KEY, order_id text NOT NULL, amount_cents bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now());`

type checkBundle struct {
	pool *pgxpool.Pool
	exp  chaos.Expect
	obs  chaos.Observed
}

// setupCheck returns a schema holding a correct run of two orders (a, b),
// one declined order and one poison message, with the gateway's calls.
func setupCheck(t *testing.T) *checkBundle {
	t.Helper()
	pool, _ := pgtest.Schema(t)
	ctx := t.Context()
	_, err := pool.Exec(ctx, paymentTables)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `
		INSERT INTO payments (order_id, amount_cents, currency) VALUES ('a', 100, 'EUR'), ('b', 250, 'usd');
		INSERT INTO ledger_entries (order_id, amount_cents) VALUES ('a', 100), ('b', 250);`)
	require.NoError(t, err)
	return &checkBundle{
		pool: pool,
		exp: chaos.Expect{
			Orders:   []chaos.Order{{ID: "a", AmountCents: 100, Currency: "EUR", Copies: 2}, {ID: "b", AmountCents: 250, Currency: "usd", Copies: 1}},
			Declined: []chaos.Order{{ID: "c-declined", AmountCents: 999, Currency: "EUR", Copies: 1}},
			Poison:   [][]byte{[]byte(`{not json`)},
		},
		obs: chaos.Observed{
			Gateway: true,
			Calls: []chaos.Charge{
				{Key: "payment:a", OrderID: "a", AmountCents: 100, Currency: "EUR", Status: 201, Created: true},
				{Key: "payment:a", OrderID: "a", AmountCents: 100, Currency: "EUR", Status: 200},
				{Key: "payment:b", OrderID: "b", AmountCents: 250, Currency: "usd", Status: 503},
				{Key: "payment:b", OrderID: "b", AmountCents: 250, Currency: "usd", Status: 201, Created: true},
				{Key: "payment:c-declined", OrderID: "c-declined", AmountCents: 999, Currency: "EUR", Status: 402},
			},
			DeadLetters: []chaos.DeadLetter{
				{Body: []byte(`{not json`), Error: "decode: invalid character"},
				{Body: []byte(`{"order_id":"c-declined","amount_cents":999,"currency":"EUR"}`), Error: "permanent: HTTP 402"},
			},
			Leftover: map[string]int{"q": 0, "q.retry.1s": 0},
		},
	}
}

func TestCheckPasses(t *testing.T) {
	t.Parallel()
	b := setupCheck(t)
	res, err := chaos.Check(t.Context(), b.pool, b.exp, b.obs)
	require.NoError(t, err)
	require.Empty(t, res.Violations)
	require.True(t, res.OK())
	require.Equal(t, 2, res.Payments)
	require.Equal(t, 2, res.LedgerEntries)
	require.Equal(t, 2, res.ChargesCreated)
	require.Equal(t, 5, res.GatewayCalls)
	require.Equal(t, 2, res.ExtraCalls, "one replay of a, one retry of b")
}

func TestCheckFindsViolations(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		sql   string
		edit  func(b *checkBundle)
		wants string
	}{
		{name: "duplicate ledger entry", sql: `INSERT INTO ledger_entries (order_id, amount_cents) VALUES ('a', 100)`, wants: "duplicate effect: 1 orders have more than one ledger entry: a×2"},
		{name: "lost ledger entry", sql: `DELETE FROM ledger_entries WHERE order_id = 'b'`, wants: "lost effect: 1 orders have no ledger entry: b"},
		{name: "lost payments row", sql: `DELETE FROM payments WHERE order_id = 'a'`, wants: "lost effect: 1 orders have no payments row: a"},
		{name: "effect of a declined order", sql: `INSERT INTO ledger_entries (order_id, amount_cents) VALUES ('c-declined', 999)`, wants: "unexpected effect: 1 rows for orders that must write nothing: c-declined"},
		{name: "wrong amount", sql: `UPDATE payments SET amount_cents = 101 WHERE order_id = 'a'`, wants: "wrong effect: 1 rows differ from the published order: a"},
		{name: "double charge", edit: func(b *checkBundle) {
			b.obs.Calls = append(b.obs.Calls, chaos.Charge{Key: "payment:a", OrderID: "a", AmountCents: 100, Currency: "EUR", Status: 201, Created: true})
		}, wants: "duplicate charge: 1 orders were charged more than once: a×2"},
		{name: "lost charge", edit: func(b *checkBundle) { b.obs.Calls = b.obs.Calls[:3] }, wants: "lost charge: 1 orders were never charged: b"},
		{name: "unstable key", edit: func(b *checkBundle) { b.obs.Calls[1].Key = "msg-17" }, wants: "unstable idempotency key"},
		{name: "missing dead letter", edit: func(b *checkBundle) { b.obs.DeadLetters = b.obs.DeadLetters[1:] }, wants: "missing dead letter: 1 poison or declined messages are not in the DLQ"},
		{name: "dead letter without reason", edit: func(b *checkBundle) { b.obs.DeadLetters[0].Error = "" }, wants: "dead letter without x-error"},
		{name: "valid message dead-lettered", edit: func(b *checkBundle) {
			b.obs.DeadLetters = append(b.obs.DeadLetters, chaos.DeadLetter{Body: []byte(`{"order_id":"a"}`), Error: "exhausted"})
		}, wants: "unexpected dead letter: 1 valid messages were dead-lettered: a (exhausted)"},
		{name: "not drained", edit: func(b *checkBundle) { b.obs.Leftover["q.retry.1s"] = 3 }, wants: "not drained: messages left after every worker stopped: q.retry.1s=3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setupCheck(t)
			if tt.sql != "" {
				_, err := b.pool.Exec(t.Context(), tt.sql)
				require.NoError(t, err)
			}
			if tt.edit != nil {
				tt.edit(b)
			}
			res, err := chaos.Check(context.Background(), b.pool, b.exp, b.obs)
			require.NoError(t, err)
			require.Len(t, res.Violations, 1, "violations: %q", res.Violations)
			require.True(t, strings.HasPrefix(res.Violations[0], tt.wants), "got %q", res.Violations[0])
			require.False(t, res.OK())
		})
	}
}
