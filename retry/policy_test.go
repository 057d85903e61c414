package retry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/retry"
)

func TestExponentialBoundsAndGrowth(t *testing.T) {
	t.Parallel()
	p := retry.Exponential{InitialInterval: 100 * time.Millisecond, Multiplier: 2, RandomizationFactor: 0.2, MaxInterval: time.Second, MaxAttempts: 5}
	for attempt := 1; attempt < 5; attempt++ {
		base := min(100*time.Millisecond<<(attempt-1), time.Second)
		for range 50 {
			d, ok := p.NextDelay(attempt, nil)
			require.True(t, ok)
			require.GreaterOrEqual(t, d, time.Duration(float64(base)*0.8)-time.Millisecond, "attempt %d", attempt)
			require.LessOrEqual(t, d, time.Duration(float64(base)*1.2)+time.Millisecond, "attempt %d", attempt)
		}
	}
	_, ok := p.NextDelay(5, nil)
	require.False(t, ok, "the last attempt allows no retry")
	require.Equal(t, 5, p.Attempts())
}

func TestExponentialJitterSpreads(t *testing.T) {
	t.Parallel()
	p := retry.Exponential{InitialInterval: time.Second}
	seen := map[time.Duration]bool{}
	for range 20 {
		d, _ := p.NextDelay(3, nil)
		seen[d] = true
	}
	require.Greater(t, len(seen), 1, "jitter must spread delays")

	noJitter := retry.Exponential{InitialInterval: time.Second, RandomizationFactor: -1}
	d, ok := noJitter.NextDelay(3, nil)
	require.True(t, ok)
	require.Equal(t, 4*time.Second, d)
}

func TestExponentialDefaults(t *testing.T) {
	t.Parallel()
	var p retry.Exponential
	require.Equal(t, 8, p.Attempts())
	d, ok := p.NextDelay(100, nil)
	require.False(t, ok)
	require.Zero(t, d)
	d, ok = p.NextDelay(7, nil)
	require.True(t, ok)
	require.LessOrEqual(t, d, 12*time.Minute)
}

func TestInProcessDo(t *testing.T) {
	t.Parallel()
	fast := retry.InProcess{Tries: 3, InitialInterval: time.Millisecond, MaxInterval: 2 * time.Millisecond}
	boom := errors.New("blip")

	t.Run("recovers from blips", func(t *testing.T) {
		t.Parallel()
		calls := 0
		err := fast.Do(context.Background(), func(context.Context) error {
			calls++
			if calls < 3 {
				return boom
			}
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, 3, calls)
	})
	t.Run("stops after tries", func(t *testing.T) {
		t.Parallel()
		calls := 0
		err := fast.Do(context.Background(), func(context.Context) error { calls++; return boom })
		require.ErrorIs(t, err, boom)
		require.Equal(t, 4, calls)
	})
	t.Run("permanent and duplicate are not retried", func(t *testing.T) {
		t.Parallel()
		for _, e := range []error{retry.Permanent(boom), retry.ErrDuplicate, retry.After(time.Second, boom), retry.Interrupted(boom)} {
			calls := 0
			err := fast.Do(context.Background(), func(context.Context) error { calls++; return e })
			require.ErrorIs(t, err, e)
			require.Equal(t, 1, calls, "%v", e)
		}
	})
	t.Run("rules decide", func(t *testing.T) {
		t.Parallel()
		calls := 0
		perm := func(error) (retry.Decision, bool) { return retry.Decision{Kind: retry.KindPermanent}, true }
		_ = fast.Do(context.Background(), func(context.Context) error { calls++; return boom }, perm)
		require.Equal(t, 1, calls)
	})
	t.Run("disabled", func(t *testing.T) {
		t.Parallel()
		calls := 0
		_ = retry.InProcess{Tries: -1}.Do(context.Background(), func(context.Context) error { calls++; return boom })
		require.Equal(t, 1, calls)
	})
	t.Run("context cancel joins errors", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		slow := retry.InProcess{Tries: 5, InitialInterval: time.Hour, MaxInterval: time.Hour}
		calls := 0
		err := slow.Do(ctx, func(context.Context) error { calls++; cancel(); return boom })
		require.ErrorIs(t, err, boom)
		require.ErrorIs(t, err, context.Canceled)
		require.Equal(t, 1, calls)
	})
}

func TestTier(t *testing.T) {
	t.Parallel()
	tiers := []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}
	require.Equal(t, time.Second, retry.Tier(tiers, 0))
	require.Equal(t, time.Second, retry.Tier(tiers, time.Second))
	require.Equal(t, 5*time.Second, retry.Tier(tiers, 1100*time.Millisecond))
	require.Equal(t, 30*time.Second, retry.Tier(tiers, time.Hour))
}
