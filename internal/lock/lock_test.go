package lock_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/lock"
	"github.com/inboxmq/inboxmq/internal/redistest"
)

type testBundle struct {
	rdb    redis.UniversalClient // direct, for assertions
	flaky  *redistest.Flaky      // what the lock gets
	prefix string
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	rdb, prefix := redistest.Client(t)
	return &testBundle{rdb: rdb, flaky: redistest.NewFlaky(rdb), prefix: prefix}
}

// obtain takes the lock named key with lease 0 (the whole ttl).
func (b *testBundle) obtain(t *testing.T, key string, ttl time.Duration) *lock.Lock {
	t.Helper()
	l, err := lock.Obtain(t.Context(), b.flaky, b.prefix+key, ttl, 0)
	require.NoError(t, err)
	return l
}

// pttl is the remaining time to live of the lock named key.
func (b *testBundle) pttl(t *testing.T, key string) time.Duration {
	t.Helper()
	lockKey, _ := lock.RedisKeys(b.prefix + key)
	return b.rdb.PTTL(t.Context(), lockKey).Val()
}

func TestObtainRelease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	key := b.prefix + "k"

	l := b.obtain(t, "k", 10*time.Second)
	require.Equal(t, key, l.Key())
	require.Positive(t, l.Fence())
	ttl := b.pttl(t, "k")
	require.Greater(t, ttl, 9*time.Second)
	require.LessOrEqual(t, ttl, 10*time.Second)

	_, err := lock.Obtain(ctx, b.flaky, key, 10*time.Second, 0)
	require.ErrorIs(t, err, lock.ErrNotObtained)
	var held *lock.HeldError
	require.ErrorAs(t, err, &held, "the holder's remaining TTL comes with the answer")
	require.Equal(t, key, held.Key)
	require.Greater(t, held.TTL, 8*time.Second)
	require.LessOrEqual(t, held.TTL, 10*time.Second)

	require.NoError(t, l.Release(ctx))
	require.ErrorIs(t, l.Release(ctx), lock.ErrNotHeld)
	lockKey, _ := lock.RedisKeys(key)
	require.Zero(t, b.rdb.Exists(ctx, lockKey).Val())

	l2 := b.obtain(t, "k", 10*time.Second)
	require.Greater(t, l2.Fence(), l.Fence())
	require.NoError(t, l2.Release(ctx))
}

// An obtain with a lease sets the lease; a refresh sets the ttl, and only
// while the key holds the token: it never recreates a vanished lock.
func TestRefresh(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)

	l, err := lock.Obtain(ctx, b.flaky, b.prefix+"k", time.Minute, 2*time.Second)
	require.NoError(t, err)
	require.LessOrEqual(t, b.pttl(t, "k"), 2*time.Second)
	require.NoError(t, l.Refresh(ctx))
	require.Greater(t, b.pttl(t, "k"), 50*time.Second)

	lockKey, _ := lock.RedisKeys(b.prefix + "k")
	require.NoError(t, b.rdb.Del(ctx, lockKey).Err())
	require.ErrorIs(t, l.Refresh(ctx), lock.ErrNotHeld)
	require.Zero(t, b.rdb.Exists(ctx, lockKey).Val())
}

func TestStaleTokenDoesNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)

	stale := b.obtain(t, "k", time.Minute)
	// The stale holder's lock expires (simulated by deleting it) and a new
	// holder takes it.
	lockKey, _ := lock.RedisKeys(b.prefix + "k")
	require.NoError(t, b.rdb.Del(ctx, lockKey).Err())
	fresh := b.obtain(t, "k", time.Minute)
	require.Greater(t, fresh.Fence(), stale.Fence())

	require.ErrorIs(t, stale.Release(ctx), lock.ErrNotHeld)
	require.ErrorIs(t, stale.Refresh(ctx), lock.ErrNotHeld)
	require.NoError(t, fresh.Release(ctx), "the fresh holder's lock was untouched")
}

func TestFenceStrictlyIncreases(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	key := b.prefix + "k"

	// Holders in turn, from several goroutines: every obtained fence is
	// unique and, in the order of obtaining, strictly increasing.
	var (
		mu     sync.Mutex
		fences []int64
		wg     sync.WaitGroup
	)
	for range 4 {
		wg.Go(func() {
			for got := 0; got < 10; {
				mu.Lock()
				l, err := lock.Obtain(ctx, b.rdb, key, 10*time.Second, 0)
				if err == nil {
					fences = append(fences, l.Fence())
				}
				mu.Unlock()
				if err != nil {
					continue // held by another goroutine
				}
				if err := l.Release(ctx); err != nil {
					t.Error(err)
					return
				}
				got++
			}
		})
	}
	wg.Wait()
	require.Len(t, fences, 40)
	for i := 1; i < len(fences); i++ {
		require.Greater(t, fences[i], fences[i-1], "fences in obtain order: %v", fences)
	}
	_, fenceKey := lock.RedisKeys(key)
	require.Greater(t, b.rdb.PTTL(ctx, fenceKey).Val(), 23*time.Hour, "the counter outlives its locks")
}

func TestRedisErrors(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	l := b.obtain(t, "k", time.Minute)

	b.flaky.Fail.Store(true)
	_, err := lock.Obtain(ctx, b.flaky, b.prefix+"other", time.Minute, 0)
	require.ErrorContains(t, err, "lock: obtain")
	require.ErrorContains(t, err, "connection refused")
	require.NotErrorIs(t, err, lock.ErrNotObtained)
	require.ErrorContains(t, l.Release(ctx), "lock: release")
	require.ErrorContains(t, l.Refresh(ctx), "lock: refresh")

	// A hung Redis: the caller's deadline ends the call, and its error is
	// joined.
	b.flaky.Fail.Store(false)
	b.flaky.Hang.Store(true)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err = lock.Obtain(cctx, b.flaky, b.prefix+"other", time.Minute, 0)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.True(t, strings.HasPrefix(err.Error(), "lock: "), err.Error())

	b.flaky.Hang.Store(false)
	require.NoError(t, l.Release(ctx))
}

func TestInvalidArguments(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)

	for _, key := range []string{"", "}x"} {
		_, err := lock.Obtain(ctx, b.flaky, key, time.Second, 0)
		require.ErrorContains(t, err, "lock: invalid key")
	}
	_, err := lock.Obtain(ctx, b.flaky, b.prefix+"k", time.Microsecond, 0)
	require.ErrorContains(t, err, "want a ttl of 1ms or more")
	_, err = lock.Obtain(ctx, b.flaky, b.prefix+"k", time.Second, -time.Second)
	require.ErrorContains(t, err, "a lease of 0 or more")
	require.Zero(t, b.flaky.Calls.Load(), "invalid calls never reach Redis")
}
