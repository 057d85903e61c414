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
	l := b.obtain(t, "k", ttl)
	kctx, stop := l.KeepAlive(ctx, 0, 0)
	defer stop()

	// Three TTLs later the lock is still ours and the context alive. The
	// wait is the subject of the test (time passing), not a synchronisation.
	select {
	case <-kctx.Done():
		t.Fatalf("keep-alive context ended: %v", context.Cause(kctx))
	case <-time.After(3 * ttl):
	}
	require.Positive(t, b.pttl(t, "k"))
	require.GreaterOrEqual(t, b.flaky.Calls.Load(), int64(1+3), "obtain plus a refresh every TTL/3 (some may run late on a busy machine)")

	stop()
	require.ErrorIs(t, context.Cause(kctx), context.Canceled)
	stop() // idempotent
	require.NoError(t, l.Release(ctx), "stop does not release")
}

func TestKeepAliveMaxHold(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)

	l := b.obtain(t, "k", 200*time.Millisecond)
	kctx, stop := l.KeepAlive(ctx, 500*time.Millisecond, 0)
	defer stop()

	testenv.WaitChan(t, kctx.Done(), "keep-alive context to end at MaxHold")
	require.ErrorIs(t, context.Cause(kctx), lock.ErrMaxHoldReached)
	// It was kept past its TTL until the cap.
	require.GreaterOrEqual(t, b.flaky.Calls.Load(), int64(1+3))
	stop()
	require.ErrorIs(t, context.Cause(kctx), lock.ErrMaxHoldReached, "stop keeps the first cause")
}

func TestKeepAliveLockDeleted(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)

	l := b.obtain(t, "k", 300*time.Millisecond)
	kctx, stop := l.KeepAlive(ctx, 0, 0)
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

	l := b.obtain(t, "k", 300*time.Millisecond)
	b.flaky.Hang.Store(true) // Redis stops answering.
	kctx, stop := l.KeepAlive(ctx, 0, 0)
	defer stop()

	testenv.WaitChan(t, kctx.Done(), "keep-alive context to end when the TTL ran out")
	require.ErrorIs(t, context.Cause(kctx), lock.ErrLockLost)
	require.ErrorContains(t, context.Cause(kctx), "ttl ran out without a successful refresh")
	require.ErrorIs(t, context.Cause(kctx), context.DeadlineExceeded, "the last refresh's error is kept")
	b.flaky.Hang.Store(false)
}

func TestKeepAliveParentEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)

	l := b.obtain(t, "k", time.Second)
	parent, cancel := context.WithCancel(t.Context())
	kctx, stop := l.KeepAlive(parent, 0, 0)
	cancel()
	testenv.WaitChan(t, kctx.Done(), "keep-alive context to follow its parent")
	stop() // no refresh is under way, and no goroutine is left (goleak checks at the end)
	require.ErrorIs(t, context.Cause(kctx), context.Canceled)
	require.NoError(t, l.Release(t.Context()))
}
