package ops_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/internal/ops"
)

// A change's reach counts the live workers serving the namespace with
// their controls on, names those with them off, and knows a namespace
// from any presence row, control or block.
func TestReach(t *testing.T) {
	t.Parallel()
	workers := []control.Presence{
		{ID: "w1", Namespaces: []string{"payments", "refunds"}, Controls: true, State: "live"},
		{ID: "w2", Namespaces: []string{"payments"}, Controls: true, State: "live"},
		{ID: "w3", Namespaces: []string{"payments", "emails"}, Controls: false, State: "live"},
		{ID: "w4", Namespaces: []string{"refunds"}, Controls: true, State: "stale"},
		{ID: "w5", Namespaces: []string{"reports"}, Controls: true, State: "stopped"},
		{ID: "w6", Namespaces: []string{"emails"}, Controls: false, State: "live"},
	}
	snap := &control.Snapshot{
		Controls: []control.Control{{Namespace: "paused-long-ago"}},
		Blocks:   []control.Block{{Namespace: "blocked-only", Pattern: "k"}},
	}
	for _, tc := range []struct {
		ns               string
		obeying, off     []string
		summary, warning string
		known            bool
	}{
		{"payments", []string{"w1", "w2"}, []string{"w3"}, "2 live workers obey",
			"1 live worker serves payments with controls off (w3) and ignores the change", true},
		{"refunds", []string{"w1"}, []string{}, "1 live worker obeys", "", true},
		{"emails", []string{}, []string{"w3", "w6"}, "no live worker obeys",
			"2 live workers serve emails but have controls off (w3, w6): nothing obeys the change", true},
		{"reports", []string{}, []string{}, "no live worker obeys",
			"no live worker serves reports: nothing obeys the change until a worker serving it starts", true},
		{"paused-long-ago", []string{}, []string{}, "no live worker obeys",
			"no live worker serves paused-long-ago: nothing obeys the change until a worker serving it starts", true},
		{"blocked-only", []string{}, []string{}, "no live worker obeys",
			"no live worker serves blocked-only: nothing obeys the change until a worker serving it starts", true},
		{"paymnets", []string{}, []string{}, "no live worker obeys",
			"no live worker serves paymnets: nothing obeys the change until a worker serving it starts", false},
	} {
		r := ops.NewReach(tc.ns, workers, snap)
		require.Equal(t, tc.obeying, r.Obeying, tc.ns)
		require.Equal(t, tc.off, r.ControlsOff, tc.ns)
		require.Equal(t, tc.summary, r.Summary(), tc.ns)
		require.Equal(t, tc.warning, r.Warning(), tc.ns)
		require.Equal(t, tc.known, r.Known, tc.ns)
		if tc.known {
			require.NoError(t, r.Unknown(), tc.ns)
		} else {
			require.EqualError(t, r.Unknown(), `unknown namespace "paymnets": no worker announced it and no control or block names it `+
				`(known: blocked-only, emails, paused-long-ago, payments, refunds, reports)`)
		}
	}
	require.EqualError(t, ops.NewReach("x", nil, nil).Unknown(),
		`unknown namespace "x": no worker announced it and no control or block names it (known: none)`)
}
