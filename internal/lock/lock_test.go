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
	rdb    redis.UniversalClient
	flaky  *redistest.Flaky
	locker *lock.Locker
	prefix string
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	rdb, prefix := redistest.Client(t)
	flaky := redistest.NewFlaky(rdb)
	locker, err := lock.New(flaky, nil)
	require.NoError(t, err)
	return &testBundle{rdb: rdb, flaky: flaky, locker: locker, prefix: prefix}
}

func TestObtainRelease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	key := b.prefix + "k"

	l, err := b.locker.Obtain(ctx, key, 10*time.Second, nil)
	require.NoError(t, err)
	require.Equal(t, key, l.Key())
	require.Positive(t, l.Fence())
	require.NotEmpty(t, l.Token())

	lockKey, _ := lock.RedisKeys(key)
	val, err := b.rdb.Get(ctx, lockKey).Result()
	require.NoError(t, err)
	require.Equal(t, l.Token(), val)

	ttl, err := l.TTL(ctx)
	require.NoError(t, err)
	require.Greater(t, ttl, 9*time.Second)
	require.LessOrEqual(t, ttl, 10*time.Second)

	_, err = b.locker.Obtain(ctx, key, 10*time.Second, nil)
	require.ErrorIs(t, err, lock.ErrNotObtained)
	var held *lock.HeldError
	require.ErrorAs(t, err, &held, "the holder's remaining TTL comes with the answer")
	require.Equal(t, key, held.Key)
	require.Greater(t, held.TTL, 8*time.Second)
	require.LessOrEqual(t, held.TTL, 10*time.Second)

	require.NoError(t, l.Release(ctx))
	require.ErrorIs(t, l.Release(ctx), lock.ErrNotHeld)
	_, err = l.TTL(ctx)
	require.ErrorIs(t, err, lock.ErrNotHeld)
	require.Equal(t, int64(0), b.rdb.Exists(ctx, lockKey).Val())

	l2, err := b.locker.Obtain(ctx, key, 10*time.Second, nil)
	require.NoError(t, err)
	require.NotEqual(t, l.Token(), l2.Token())
	require.NoError(t, l2.Release(ctx))
}

func TestRefresh(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	key := b.prefix + "k"

	l, err := b.locker.Obtain(ctx, key, 2*time.Second, nil)
	require.NoError(t, err)
	require.NoError(t, l.Refresh(ctx, time.Minute))
	ttl, err := l.TTL(ctx)
	require.NoError(t, err)
	require.Greater(t, ttl, 50*time.Second)

	// Zero reuses the obtain TTL.
	require.NoError(t, l.Refresh(ctx, 0))
	ttl, err = l.TTL(ctx)
	require.NoError(t, err)
	require.LessOrEqual(t, ttl, 2*time.Second)

	require.Error(t, l.Refresh(ctx, time.Microsecond))

	// The key vanishes (expiry, or a flushed Redis): refresh must not
	// recreate it.
	lockKey, _ := lock.RedisKeys(key)
	require.NoError(t, b.rdb.Del(ctx, lockKey).Err())
	require.ErrorIs(t, l.Refresh(ctx, time.Minute), lock.ErrNotHeld)
	require.Equal(t, int64(0), b.rdb.Exists(ctx, lockKey).Val())
}

func TestStaleTokenDoesNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	key := b.prefix + "k"

	stale, err := b.locker.Obtain(ctx, key, time.Minute, nil)
	require.NoError(t, err)
	// The stale holder's lock expires (simulated by deleting it) and a new
	// holder takes it.
	lockKey, _ := lock.RedisKeys(key)
	require.NoError(t, b.rdb.Del(ctx, lockKey).Err())
	fresh, err := b.locker.Obtain(ctx, key, time.Minute, nil)
	require.NoError(t, err)
	require.Greater(t, fresh.Fence(), stale.Fence())

	require.ErrorIs(t, stale.Release(ctx), lock.ErrNotHeld)
	require.ErrorIs(t, stale.Refresh(ctx, time.Hour), lock.ErrNotHeld)
	_, err = stale.TTL(ctx)
	require.ErrorIs(t, err, lock.ErrNotHeld)

	// The fresh holder is untouched.
	val, err := b.rdb.Get(ctx, lockKey).Result()
	require.NoError(t, err)
	require.Equal(t, fresh.Token(), val)
	ttl, err := fresh.TTL(ctx)
	require.NoError(t, err)
	require.LessOrEqual(t, ttl, time.Minute)
	require.NoError(t, fresh.Release(ctx))
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
				l, err := b.locker.Obtain(ctx, key, 10*time.Second, &lock.ObtainOpts{Wait: 10 * time.Second, RetryInterval: time.Millisecond})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				fences = append(fences, l.Fence())
				mu.Unlock()
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
	ttl, err := b.rdb.PTTL(ctx, fenceKey).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, 23*time.Hour, "fence counter carries Config.FenceTTL")
}

func TestObtainWait(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	key := b.prefix + "k"

	held, err := b.locker.Obtain(ctx, key, time.Minute, nil)
	require.NoError(t, err)

	t.Run("GivesUpAfterWait", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		_, err := b.locker.Obtain(ctx, key, time.Minute, &lock.ObtainOpts{Wait: 100 * time.Millisecond, RetryInterval: 10 * time.Millisecond})
		require.ErrorIs(t, err, lock.ErrNotObtained)
		require.GreaterOrEqual(t, time.Since(start), 90*time.Millisecond)
	})
	t.Run("ContextEnds", func(t *testing.T) {
		t.Parallel()
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := b.locker.Obtain(cctx, key, time.Minute, &lock.ObtainOpts{Wait: time.Hour})
			done <- err
		}()
		cancel()
		err := <-done
		require.ErrorIs(t, err, context.Canceled)
	})
	t.Run("ObtainsOnRelease", func(t *testing.T) {
		t.Parallel()
		other, err := b.locker.Obtain(ctx, b.prefix+"other", time.Minute, nil)
		require.NoError(t, err)
		done := make(chan *lock.Lock, 1)
		go func() {
			l, err := b.locker.Obtain(ctx, b.prefix+"other", time.Minute, &lock.ObtainOpts{Wait: 20 * time.Second, RetryInterval: 5 * time.Millisecond})
			if err != nil {
				t.Error(err)
			}
			done <- l
		}()
		require.NoError(t, other.Release(ctx))
		l := <-done
		require.NotNil(t, l)
		require.Greater(t, l.Fence(), other.Fence())
		require.NoError(t, l.Release(ctx))
	})
	t.Cleanup(func() { _ = held.Release(context.Background()) })
}

func TestRedisErrors(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	key := b.prefix + "k"

	l, err := b.locker.Obtain(ctx, key, time.Minute, nil)
	require.NoError(t, err)

	b.flaky.Fail.Store(true)
	_, err = b.locker.Obtain(ctx, b.prefix+"other", time.Minute, nil)
	require.ErrorContains(t, err, "lock: obtain")
	require.ErrorContains(t, err, "connection refused")
	require.NotErrorIs(t, err, lock.ErrNotObtained)
	require.ErrorContains(t, l.Release(ctx), "lock: release")
	require.ErrorContains(t, l.Refresh(ctx, 0), "lock: refresh")
	_, err = l.TTL(ctx)
	require.ErrorContains(t, err, "lock: ttl")

	// A hung Redis: the caller's deadline ends the call, and its error is
	// joined.
	b.flaky.Fail.Store(false)
	b.flaky.Hang.Store(true)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err = b.locker.Obtain(cctx, b.prefix+"other", time.Minute, nil)
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
		_, err := b.locker.Obtain(ctx, key, time.Second, nil)
		require.ErrorContains(t, err, "lock: invalid key")
	}
	_, err := b.locker.Obtain(ctx, b.prefix+"k", time.Microsecond, nil)
	require.ErrorContains(t, err, "ttl must be at least 1ms")
	require.Zero(t, b.flaky.Calls.Load(), "invalid calls never reach Redis")
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:0"})
	t.Cleanup(func() { _ = rdb.Close() })

	tests := []struct {
		name    string
		cfg     *lock.Config
		wantErr string
	}{
		{name: "Nil", cfg: nil},
		{name: "Zero", cfg: &lock.Config{}},
		{name: "NoExpiry", cfg: &lock.Config{FenceTTL: -1}},
		{name: "Hour", cfg: &lock.Config{FenceTTL: time.Hour}},
		{name: "Negative", cfg: &lock.Config{FenceTTL: -2}, wantErr: "FenceTTL must be positive or -1"},
		{name: "TooShort", cfg: &lock.Config{FenceTTL: time.Microsecond}, wantErr: "at least 1ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l, err := lock.New(rdb, tt.cfg)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				require.Nil(t, l)
				return
			}
			require.NoError(t, err)
			require.NotNil(t, l)
		})
	}
	_, err := lock.New(nil, nil)
	require.ErrorContains(t, err, "lock: nil client")
}

func TestFenceTTLDisabled(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	locker, err := lock.New(b.rdb, &lock.Config{FenceTTL: -1})
	require.NoError(t, err)
	l, err := locker.Obtain(ctx, b.prefix+"k", time.Second, nil)
	require.NoError(t, err)
	_, fenceKey := lock.RedisKeys(b.prefix + "k")
	require.Equal(t, time.Duration(-1), b.rdb.PTTL(ctx, fenceKey).Val())
	require.NoError(t, l.Release(ctx))
}
