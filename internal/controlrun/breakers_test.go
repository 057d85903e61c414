package controlrun_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/internal/controlrun"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// The reporter publishes the latest state of each breaker off the delivery
// path, and its worker's rows go when it stops.
func TestBreakerReporter_PublishesLatestAndClearsOnStop(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := pgtest.Schema(t)
	s := control.NewStore(pool)
	require.NoError(t, controlrun.SetBreaker(ctx, pool, control.BreakerState{Namespace: "payments", Downstream: "gateway", Worker: "other", State: "open"}))
	require.Error(t, controlrun.SetBreaker(ctx, pool, control.BreakerState{Namespace: "payments", Downstream: "gateway", Worker: "w", State: "ajar"}))

	r := controlrun.NewBreakerReporter(pool, "w1", nil)
	require.NoError(t, r.Start(ctx))
	r.Report("payments", "gateway", "open")
	r.Report("payments", "gateway", "half-open")
	r.Report("refunds", "gateway", "closed")
	state := func(namespace string) string {
		bs, err := s.Breakers(ctx, namespace)
		require.NoError(t, err)
		for _, b := range bs {
			if b.Worker == "w1" {
				return b.State
			}
		}
		return ""
	}
	testenv.WaitFor(t, "the latest states published", func() bool {
		return state("payments") == "half-open" && state("refunds") == "closed"
	})
	all, err := s.Breakers(ctx, "")
	require.NoError(t, err)
	require.Len(t, all, 3)

	require.NoError(t, r.Stop(ctx))
	all, err = s.Breakers(ctx, "")
	require.NoError(t, err)
	require.Len(t, all, 1, "the stopped worker's rows are gone, another worker's stay")
	require.Equal(t, "other", all[0].Worker)
}
