package chaos_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/chaos"
	"github.com/inboxmq/inboxmq/internal/pgtest"
)

// BenchmarkCheck measures the checker on a run of 10,000 orders with a
// gateway (20,000 calls) and 200 dead letters.
func BenchmarkCheck(b *testing.B) {
	pool, _ := pgtest.Schema(b)
	ctx := b.Context()
	_, err := pool.Exec(ctx, paymentTables)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `
		INSERT INTO payments (order_id, amount_cents, currency) SELECT 'o-' || i, i, 'EUR' FROM generate_series(1, 10000) i;
		INSERT INTO ledger_entries (order_id, amount_cents) SELECT 'o-' || i, i FROM generate_series(1, 10000) i;`)
	require.NoError(b, err)
	var exp chaos.Expect
	obs := chaos.Observed{Gateway: true, Leftover: map[string]int{"q": 0}}
	for i := 1; i <= 10000; i++ {
		id := fmt.Sprintf("o-%d", i)
		exp.Orders = append(exp.Orders, chaos.Order{ID: id, AmountCents: int64(i), Currency: "EUR", Copies: 2})
		c := chaos.Charge{Key: "payment:" + id, OrderID: id, AmountCents: int64(i), Currency: "EUR", Status: 201, Created: true}
		obs.Calls = append(obs.Calls, c)
		c.Status, c.Created = 200, false
		obs.Calls = append(obs.Calls, c)
	}
	for i := range 200 {
		p := fmt.Appendf(nil, "{not json %d", i)
		exp.Poison = append(exp.Poison, p)
		obs.DeadLetters = append(obs.DeadLetters, chaos.DeadLetter{Body: p, Error: "decode"})
	}
	b.ResetTimer()
	for b.Loop() {
		res, err := chaos.Check(ctx, pool, exp, obs)
		require.NoError(b, err)
		require.True(b, res.OK(), "%v", res.Violations)
	}
}
