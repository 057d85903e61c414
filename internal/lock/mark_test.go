package lock_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/lock"
	"github.com/inboxmq/inboxmq/internal/redistest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// An obtain that finds its mark holding the value takes no lock (the lock
// key stays absent and the fence does not move); a missing mark, or one
// holding another value, leaves the obtain exactly Obtain.
func TestBatcher_ObtainUnlessMarked(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupBatcher(t)
	key := b.prefix + "order-1"
	lockKey, fenceKey := lock.RedisKeys(key)
	mark := lock.Mark{Key: lock.MarkKey(b.prefix+"done:", key), Value: "fp-1"}

	l, err := b.r.ObtainUnlessMarked(ctx, key, time.Minute, mark)
	require.NoError(t, err, "no mark: the lock is taken")
	require.Equal(t, int64(1), l.Fence())
	_, err = b.r.ObtainUnlessMarked(ctx, key, time.Minute, mark)
	require.ErrorIs(t, err, lock.ErrNotObtained, "held: a HeldError as from Obtain")
	require.NoError(t, b.r.Release(ctx, l))

	require.NoError(t, b.rdb.Set(ctx, mark.Key, "fp-other", time.Minute).Err())
	l, err = b.r.ObtainUnlessMarked(ctx, key, time.Minute, mark)
	require.NoError(t, err, "another value is no hit")
	require.Equal(t, int64(2), l.Fence())
	require.NoError(t, b.r.Release(ctx, l))

	require.NoError(t, b.rdb.Set(ctx, mark.Key, "fp-1", time.Minute).Err())
	l, err = b.r.ObtainUnlessMarked(ctx, key, time.Minute, mark)
	require.ErrorIs(t, err, lock.ErrMarked)
	require.NotErrorIs(t, err, lock.ErrNotObtained)
	require.Nil(t, l)
	require.Zero(t, b.rdb.Exists(ctx, lockKey).Val(), "no lock taken")
	require.Equal(t, "2", b.rdb.Get(ctx, fenceKey).Val(), "the fence did not move")
}

// ReleaseAndMark writes the mark with its TTL and releases by
// compare-and-delete: a successor's lock survives, and the mark is written
// all the same.
func TestBatcher_ReleaseAndMark(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupBatcher(t)
	key := b.prefix + "order-2"
	lockKey, _ := lock.RedisKeys(key)
	mark := lock.Mark{Key: lock.MarkKey(b.prefix+"done:", key), Value: "fp-2", TTL: time.Minute}

	l, err := b.r.Obtain(ctx, key, time.Minute)
	require.NoError(t, err)
	require.NoError(t, b.r.ReleaseAndMark(ctx, l, mark))
	require.Zero(t, b.rdb.Exists(ctx, lockKey).Val(), "released")
	require.Equal(t, "fp-2", b.rdb.Get(ctx, mark.Key).Val())
	ttl := b.rdb.PTTL(ctx, mark.Key).Val()
	require.True(t, ttl > 59*time.Second && ttl <= time.Minute, "TTL %s", ttl)

	// Lost to a successor: its lock stays, the mark is written.
	require.NoError(t, b.rdb.Del(ctx, mark.Key).Err())
	l, err = b.r.Obtain(ctx, key, time.Minute)
	require.NoError(t, err)
	require.NoError(t, b.rdb.Set(ctx, lockKey, "successor", time.Minute).Err())
	require.ErrorIs(t, b.r.ReleaseAndMark(ctx, l, mark), lock.ErrNotHeld)
	require.Equal(t, "successor", b.rdb.Get(ctx, lockKey).Val())
	require.Equal(t, "fp-2", b.rdb.Get(ctx, mark.Key).Val())
}

func TestBatcher_MarkMustShareTheLockSlot(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupBatcher(t)
	key := b.prefix + "order-3"
	for _, m := range []lock.Mark{
		{Key: b.prefix + "done:" + key, Value: "v", TTL: time.Minute},                 // no hash tag
		{Key: lock.MarkKey(b.prefix+"done:", key+"x"), Value: "v", TTL: time.Minute},  // another lock's
		{Key: lock.MarkKey(b.prefix+"{done}:", key), Value: "v", TTL: time.Minute},    // tag moved
		{Key: lock.MarkKey(b.prefix+"done:", key), Value: "v", TTL: time.Microsecond}, // TTL
	} {
		l, err := b.r.Obtain(ctx, key, time.Minute)
		require.NoError(t, err)
		require.ErrorContains(t, b.r.ReleaseAndMark(ctx, l, m), "lock: mark", m.Key)
		require.NoError(t, b.r.Release(ctx, l))
	}
	_, err := b.r.ObtainUnlessMarked(ctx, key, time.Minute, lock.Mark{Key: b.prefix + "done:" + key})
	require.ErrorContains(t, err, "is not a MarkKey")
}

// Marked operations in a shared round trip that meets NOSCRIPT are sent
// again with their source, like the plain ones.
func TestBatcher_NoScriptMarkedOperations(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	rdb, prefix := redistest.Client(t)
	gc := &gatedClient{UniversalClient: noScriptClient{rdb}, entered: make(chan struct{}), gate: make(chan struct{})}
	locker, err := lock.New(gc, nil)
	require.NoError(t, err)
	r, err := lock.NewBatcher(locker, nil)
	require.NoError(t, err)
	first, err := locker.Obtain(ctx, prefix+"first", time.Minute, nil)
	require.NoError(t, err)
	old, err := locker.Obtain(ctx, prefix+"old", time.Minute, nil)
	require.NoError(t, err)
	oldMark := lock.Mark{Key: lock.MarkKey(prefix+"done:", old.Key()), Value: "fp-old", TTL: time.Minute}
	doneMark := lock.Mark{Key: lock.MarkKey(prefix+"done:", prefix+"done"), Value: "fp-done"}
	require.NoError(t, rdb.Set(ctx, doneMark.Key, "fp-done", time.Minute).Err())
	newMark := lock.Mark{Key: lock.MarkKey(prefix+"done:", prefix+"new"), Value: "fp-new"}

	firstDone := holdRound(t, gc, r, first)
	var wg sync.WaitGroup
	var relErr, doneErr, newErr error
	var got *lock.Lock
	wg.Go(func() { relErr = r.ReleaseAndMark(ctx, old, oldMark) })
	testenv.WaitFor(t, "release queued", func() bool { return lock.Queued(r) == 1 })
	wg.Go(func() { _, doneErr = r.ObtainUnlessMarked(ctx, prefix+"done", time.Minute, doneMark) })
	testenv.WaitFor(t, "marked obtain queued", func() bool { return lock.Queued(r) == 2 })
	wg.Go(func() { got, newErr = r.ObtainUnlessMarked(ctx, prefix+"new", time.Minute, newMark) })
	testenv.WaitFor(t, "obtain queued", func() bool { return lock.Queued(r) == 3 })
	close(gc.gate)
	wg.Wait()
	require.NoError(t, testenv.WaitChan(t, firstDone, "first release"))
	require.Equal(t, int64(1), gc.pipelines.Load())

	require.NoError(t, relErr)
	oldKey, _ := lock.RedisKeys(old.Key())
	require.Zero(t, rdb.Exists(ctx, oldKey).Val(), "released through the fallback")
	require.Equal(t, "fp-old", rdb.Get(ctx, oldMark.Key).Val(), "marked through the fallback")
	require.ErrorIs(t, doneErr, lock.ErrMarked)
	require.NoError(t, newErr)
	newKey, _ := lock.RedisKeys(got.Key())
	require.Equal(t, got.Token(), rdb.Get(ctx, newKey).Val(), "obtained through the fallback")
}
