package middleware_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/middleware"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

func TestTimeout_DeadlineCancelsHandler(t *testing.T) {
	t.Parallel()
	mw := middleware.Timeout(50 * time.Millisecond)
	err := mw(func(ctx context.Context, d *inboxtype.Delivery) error {
		deadline, ok := ctx.Deadline()
		require.True(t, ok)
		require.WithinDuration(t, time.Now().Add(50*time.Millisecond), deadline, 50*time.Millisecond)
		testenv.WaitChan(t, ctx.Done(), "the delivery deadline")
		require.ErrorIs(t, context.Cause(ctx), middleware.ErrTimeout)
		return ctx.Err()
	})(t.Context(), keyedDelivery("k"))
	require.ErrorIs(t, err, middleware.ErrTimeout)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	dec := retry.Classify(err)
	require.Equal(t, retry.KindRetry, dec.Kind)
	require.Equal(t, retry.ReasonTimeout, dec.Reason)
}

func TestTimeout_ResultsKeepTheirKind(t *testing.T) {
	t.Parallel()
	mw := middleware.Timeout(time.Minute)
	boom := errors.New("boom")
	require.NoError(t, mw(func(context.Context, *inboxtype.Delivery) error { return nil })(t.Context(), keyedDelivery("k")))
	err := mw(func(context.Context, *inboxtype.Delivery) error { return boom })(t.Context(), keyedDelivery("k"))
	require.Equal(t, boom, err, "returned unchanged before the deadline")

	// After the deadline a permanent error stays permanent and a duplicate
	// stays a duplicate.
	short := middleware.Timeout(time.Millisecond)
	err = short(func(ctx context.Context, d *inboxtype.Delivery) error {
		<-ctx.Done()
		return retry.Permanent(errors.New("invalid"))
	})(t.Context(), keyedDelivery("k"))
	require.Equal(t, retry.KindPermanent, retry.Classify(err).Kind)
	err = short(func(ctx context.Context, d *inboxtype.Delivery) error {
		<-ctx.Done()
		return retry.Duplicate(retry.SourceInbox, nil)
	})(t.Context(), keyedDelivery("k"))
	require.Equal(t, retry.KindDuplicate, retry.Classify(err).Kind)
	require.Equal(t, "duplicate", retry.Classify(err).Reason)
}

func TestTimeout_Disabled(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{0, -time.Second} {
		err := middleware.Timeout(d)(func(ctx context.Context, _ *inboxtype.Delivery) error {
			_, ok := ctx.Deadline()
			require.False(t, ok)
			return nil
		})(t.Context(), keyedDelivery("k"))
		require.NoError(t, err)
	}
}
