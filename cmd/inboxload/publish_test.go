package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBurst(t *testing.T) {
	t.Parallel()
	msgs, s := burst("run", 50, 3, 5)
	require.Equal(t, 50, s.UniqueOrders)
	require.Equal(t, 5, s.Invalid)
	require.Equal(t, s.ValidCopies+s.Invalid, s.Published)
	require.Len(t, msgs, s.Published)
	require.GreaterOrEqual(t, s.ValidCopies, 50)
	require.LessOrEqual(t, s.ValidCopies, 150)
	ids := map[string]bool{}
	orders := map[string]bool{}
	invalid := 0
	for _, m := range msgs {
		require.False(t, ids[m.id], "message ids are all different")
		ids[m.id] = true
		if m.payment == nil {
			invalid++
			require.NotEmpty(t, m.raw)
			var p payment
			if json.Unmarshal(m.raw, &p) == nil {
				require.False(t, p.OrderID != "" && p.AmountCents > 0 && len(p.Currency) == 3, "%s is invalid", m.raw)
			}
			continue
		}
		orders[m.payment.OrderID] = true
		require.Equal(t, "payment:"+m.payment.OrderID, m.payment.IdempotencyKey())
	}
	require.Equal(t, s.Invalid, invalid)
	require.Len(t, orders, s.UniqueOrders)
}
