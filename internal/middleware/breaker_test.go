package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/middleware"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// fakeRestricter records the breaker's restriction of each queue (-1: none).
type fakeRestricter struct {
	mu    sync.Mutex
	holds map[string]int
}

func (f *fakeRestricter) Restrict(queue, reason string, n int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if reason != middleware.RestrictReasonBreaker {
		return fmt.Errorf("unexpected reason %q", reason)
	}
	f.holds[queue] = n
	return nil
}

func (f *fakeRestricter) Unrestrict(queue, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.holds[queue] = -1
	return nil
}

func (f *fakeRestricter) hold(queue string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n, ok := f.holds[queue]; ok {
		return n
	}
	return -1
}

func TestBreaker_OptsValidated(t *testing.T) {
	t.Parallel()
	for _, o := range []middleware.BreakerOpts{
		{Threshold: 1.5}, {Threshold: -0.1}, {MinCalls: -1}, {Window: time.Millisecond}, {CoolDown: time.Millisecond},
	} {
		_, err := middleware.NewBreaker(&o)
		require.Error(t, err, "%+v", o)
	}
	b, err := middleware.NewBreaker(nil)
	require.NoError(t, err)
	b.Close()
	require.Equal(t, middleware.BreakerClosed, b.State())
}

// The breaker trips on the share of retryable failures once MinCalls have
// finished, pauses its queue, holds back what still reaches it without
// counting an attempt, probes one at a time after the cool-down and closes
// on success.
func TestBreaker_TripsHoldsBackProbesAndCloses(t *testing.T) {
	t.Parallel()
	target := &fakeRestricter{holds: map[string]int{}}
	var (
		mu      sync.Mutex
		changes []middleware.BreakerChange
	)
	b, err := middleware.NewBreaker(&middleware.BreakerOpts{
		Downstream: "gateway", Window: time.Second, Threshold: 0.5, MinCalls: 4, CoolDown: 200 * time.Millisecond,
		Target: target,
		OnStateChange: func(c middleware.BreakerChange) {
			mu.Lock()
			defer mu.Unlock()
			changes = append(changes, c)
		},
	})
	require.NoError(t, err)
	t.Cleanup(b.Close)

	var down sync.Mutex
	failing := true
	calls := 0
	h := b.Guard("payments")(func(context.Context, *inboxtype.Delivery) error {
		down.Lock()
		defer down.Unlock()
		calls++
		if failing {
			return errors.New("gateway: 503")
		}
		return nil
	})
	run := func() retry.Decision { return retry.Classify(h(t.Context(), &inboxtype.Delivery{Queue: "payments"})) }

	require.Equal(t, retry.KindSucceeded, retry.Classify(nil).Kind)
	// A permanent error is the message's problem: it counts as a success.
	perm := b.Guard("payments")(func(context.Context, *inboxtype.Delivery) error { return retry.Permanent(errors.New("bad")) })
	require.Equal(t, retry.KindPermanent, retry.Classify(perm(t.Context(), &inboxtype.Delivery{})).Kind)

	// 1 success + 3 failures = 4 calls, 75 % failures: the 3rd failure trips.
	for i := range 3 {
		dec := run()
		require.Equal(t, retry.KindRetry, dec.Kind)
		if i < 2 {
			require.False(t, dec.Uncounted, "failures before the trip are counted attempts")
		} else {
			require.True(t, dec.Uncounted, "the failure that trips the breaker is deferred, not counted")
			require.Equal(t, middleware.ReasonBreakerOpen, dec.Reason)
		}
	}
	require.Equal(t, middleware.BreakerOpen, b.State())
	require.Equal(t, 0, target.hold("payments"), "open pauses the queue")

	before := calls
	dec := run()
	require.Equal(t, retry.KindRetry, dec.Kind)
	require.True(t, dec.Uncounted, "held back: not an attempt")
	require.Equal(t, middleware.ReasonBreakerOpen, dec.Reason)
	require.Positive(t, dec.Delay)
	require.LessOrEqual(t, dec.Delay, 200*time.Millisecond)
	require.Equal(t, before, calls, "a held-back delivery never reaches the downstream")

	// The cool-down's timer moves the breaker to half-open by itself.
	testenv.WaitFor(t, "half-open", func() bool { return target.hold("payments") == 1 })
	require.Equal(t, middleware.BreakerHalfOpen, b.State())
	dec = run()
	require.False(t, dec.Uncounted, "a failed probe is a real attempt")
	require.Equal(t, middleware.BreakerOpen, b.State())
	require.Equal(t, 0, target.hold("payments"))

	testenv.WaitFor(t, "half-open again", func() bool { return target.hold("payments") == 1 })
	down.Lock()
	failing = false
	down.Unlock()
	require.Equal(t, retry.KindSucceeded, run().Kind)
	require.Equal(t, middleware.BreakerClosed, b.State())
	require.Equal(t, -1, target.hold("payments"), "closing lifts the breaker's restriction")

	mu.Lock()
	defer mu.Unlock()
	var seq []string
	for _, c := range changes {
		require.Equal(t, "gateway", c.Downstream)
		require.Equal(t, []string{"payments"}, c.Queues)
		seq = append(seq, c.To.String())
	}
	require.Equal(t, []string{"open", "half-open", "open", "half-open", "closed"}, seq)
}

// Interrupted deliveries, duplicates, deferrals and a stopping worker's
// cancelled contexts say nothing about the downstream.
func TestBreaker_IgnoresInterruptionsAndDeferrals(t *testing.T) {
	t.Parallel()
	b, err := middleware.NewBreaker(&middleware.BreakerOpts{MinCalls: 1, Threshold: 0.1})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	for _, e := range []error{
		retry.Interrupted(errors.New("stop")),
		retry.Defer(time.Second, errors.New("held")),
		retry.ErrDuplicate,
	} {
		h := b.Guard("q")(func(context.Context, *inboxtype.Delivery) error { return e })
		_ = h(t.Context(), &inboxtype.Delivery{})
	}
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(errors.New("stopping"))
	h := b.Guard("q")(func(context.Context, *inboxtype.Delivery) error { return errors.New("cancelled") })
	_ = h(ctx, &inboxtype.Delivery{})
	require.Equal(t, middleware.BreakerClosed, b.State())
}
