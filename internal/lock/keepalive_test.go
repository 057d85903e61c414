package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/lock"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

func TestKeepAliveExtendsPastTTL(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)

	const ttl = 300 * time.Millisecond
	l, err := b.locker.Obtain(ctx, b.prefix+"k", ttl, nil)
	require.NoError(t, err)
	kctx, stop := l.KeepAlive(ctx, nil)
	defer stop()

	// Three TTLs later the lock is still ours and the context alive. The
	// wait is the subject of the test (time passing), not a synchronisation.
	select {
	case <-kctx.Done():
		t.Fatalf("keep-alive context ended: %v", context.Cause(kctx))
	case <-time.After(3 * ttl):
	}
	remaining, err := l.TTL(ctx)
	require.NoError(t, err)
	require.Positive(t, remaining)
	require.GreaterOrEqual(t, b.flaky.Calls.Load(), int64(1+3), "obtain plus a refresh every TTL/3 (some may run late on a busy machine)")

	stop()
	require.ErrorIs(t, context.Cause(kctx), context.Canceled)
	stop() // idempotent
	// stop does not release.
	_, err = l.TTL(ctx)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
}

func TestKeepAliveMaxHold(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)

	l, err := b.locker.Obtain(ctx, b.prefix+"k", 200*time.Millisecond, nil)
	require.NoError(t, err)
	kctx, stop := l.KeepAlive(ctx, &lock.KeepAliveOpts{MaxHold: 500 * time.Millisecond})
	defer stop()

	testenv.WaitChan(t, kctx.Done(), "keep-alive context to end at MaxHold")
	require.ErrorIs(t, context.Cause(kctx), lock.ErrMaxHoldReached)
	require.GreaterOrEqual(t, time.Since(l.ObtainedAt()), 500*time.Millisecond)
	// It was kept past its TTL until the cap.
	require.GreaterOrEqual(t, b.flaky.Calls.Load(), int64(1+3))
	stop()
	require.ErrorIs(t, context.Cause(kctx), lock.ErrMaxHoldReached, "stop keeps the first cause")
}

func TestKeepAliveLockDeleted(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)

	l, err := b.locker.Obtain(ctx, b.prefix+"k", 300*time.Millisecond, nil)
	require.NoError(t, err)
	kctx, stop := l.KeepAlive(ctx, &lock.KeepAliveOpts{Interval: 20 * time.Millisecond})
	defer stop()

	lockKey, _ := lock.RedisKeys(b.prefix + "k")
	require.NoError(t, b.rdb.Del(ctx, lockKey).Err())

	testenv.WaitChan(t, kctx.Done(), "keep-alive context to end after the key vanished")
	require.ErrorIs(t, context.Cause(kctx), lock.ErrLockLost)
	require.ErrorIs(t, context.Cause(kctx), lock.ErrNotHeld, "noticed by a refresh, not by the TTL running out")
}

func TestKeepAliveRedisDown(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)

	const ttl = 300 * time.Millisecond
	l, err := b.locker.Obtain(ctx, b.prefix+"k", ttl, nil)
	require.NoError(t, err)
	b.flaky.Hang.Store(true) // Redis stops answering.
	kctx, stop := l.KeepAlive(ctx, nil)
	defer stop()

	testenv.WaitChan(t, kctx.Done(), "keep-alive context to end when the TTL ran out")
	require.ErrorIs(t, context.Cause(kctx), lock.ErrLockLost)
	require.ErrorContains(t, context.Cause(kctx), "ttl ran out without a successful refresh")
	require.ErrorIs(t, context.Cause(kctx), context.DeadlineExceeded, "the last refresh's error is kept")
	require.GreaterOrEqual(t, time.Since(l.ObtainedAt()), ttl)
	b.flaky.Hang.Store(false)
}

func TestKeepAliveParentEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)

	l, err := b.locker.Obtain(t.Context(), b.prefix+"k", time.Second, nil)
	require.NoError(t, err)
	parent, cancel := context.WithCancel(t.Context())
	kctx, stop := l.KeepAlive(parent, nil)
	cancel()
	testenv.WaitChan(t, kctx.Done(), "keep-alive context to follow its parent")
	stop() // no refresh is under way, and no goroutine is left (goleak checks at the end)
	require.ErrorIs(t, context.Cause(kctx), context.Canceled)
	require.NoError(t, l.Release(t.Context()))
}
