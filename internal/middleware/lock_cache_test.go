package middleware_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/lock"
	"github.com/inboxmq/inboxmq/internal/middleware"
	"github.com/inboxmq/inboxmq/internal/redistest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// lockCacheBundle is a Cache mounted in front of a Lock, as the worker
// mounts them, and the keys they use for
// consumer "svc".
type lockCacheBundle struct {
	*redisBundle
	mw inboxtype.Middleware
}

func setupLockCache(t *testing.T, opts *middleware.LockOpts) *lockCacheBundle {
	t.Helper()
	b := setupRedis(t)
	o := middleware.LockOpts{}
	if opts != nil {
		o = *opts
	}
	o.Prefix = b.prefix + "lock:"
	cache := middleware.Cache(b.flaky, &middleware.CacheOpts{
		Prefix: b.prefix + "done:", TTL: time.Minute, CallTimeout: o.CallTimeout, ProbeInterval: o.ProbeInterval,
	})
	lck := mustLock(t, b.flaky, &o)
	return &lockCacheBundle{redisBundle: b, mw: func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler { return cache(lck(next)) }}
}

// lockName is the lock's name for key; markKey its completed-cache entry.
func (b *lockCacheBundle) lockName(key string) string { return b.prefix + "lock:svc:" + key }

func (b *lockCacheBundle) markKey(key string) string { return b.prefix + "done:svc:" + key }

func (b *lockCacheBundle) run(ctx context.Context, d *inboxtype.Delivery, fn inboxtype.DeliveryHandler) error {
	return b.mw(fn)(ctx, d)
}

// A completed delivery writes the entry after the handler; its redelivery
// is a cache duplicate that takes no lock and skips the handler.
func TestLockCache_HitTakesNoLock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupLockCache(t, nil)

	d := keyedDelivery("order-1")
	calls := 0
	err := b.run(ctx, d, func(_ context.Context, d *inboxtype.Delivery) error {
		calls++
		require.Equal(t, middleware.LockAcquired, d.LockResult)
		require.Zero(t, b.rdb.Exists(ctx, b.markKey("order-1")).Val(), "no entry before the commit")
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 1, calls)
	lockKey, fenceKey := lock.RedisKeys(b.lockName("order-1"))
	require.Zero(t, b.rdb.Exists(ctx, lockKey).Val(), "released")
	require.Equal(t, cacheValue(d), b.rdb.Get(ctx, b.markKey("order-1")).Val(), "the entry is the job's fingerprint")
	ttl := b.rdb.PTTL(ctx, b.markKey("order-1")).Val()
	require.True(t, ttl > 59*time.Second && ttl <= time.Minute, "Cache.TTL: %s", ttl)
	fence := b.rdb.Get(ctx, fenceKey).Val()

	again := keyedDelivery("order-1")
	err = b.run(ctx, again, countingHandler(&calls, nil))
	require.Equal(t, 1, calls, "the handler is skipped")
	dec := retry.Classify(err)
	require.Equal(t, retry.KindDuplicate, dec.Kind)
	require.Equal(t, retry.SourceCache, dec.Source)
	require.Empty(t, again.LockResult, "no lock taken")
	require.Zero(t, again.LockFence)
	require.Equal(t, fence, b.rdb.Get(ctx, fenceKey).Val(), "the fence did not move: no obtain ran")
}

// The entry is written only for a completed job (what Cache writes after),
// and the lock is released whatever the outcome.
func TestLockCache_WritesOnlyAfterCompletion(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupLockCache(t, nil)
	tests := []struct {
		name   string
		err    error
		cached bool
	}{
		{name: "Success", err: nil, cached: true},
		{name: "InboxDuplicate", err: retry.Duplicate(retry.SourceInbox, nil), cached: true},
		{name: "ClaimHeldElsewhere", err: retry.Duplicate(retry.SourceClaimHeld, nil), cached: false},
		{name: "KeyConflict", err: retry.Permanent(retry.ErrKeyConflict), cached: false},
		{name: "BusinessConstraint", err: retry.Duplicate(retry.SourceBusiness, nil), cached: false},
		{name: "Retryable", err: retry.After(time.Second, errors.New("gateway 503")), cached: false},
		{name: "Unknown", err: errors.New("boom"), cached: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			calls := 0
			err := b.run(ctx, keyedDelivery(tt.name), countingHandler(&calls, tt.err))
			require.Equal(t, 1, calls)
			if tt.err == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tt.err, "the handler's result is returned unchanged")
			}
			lockKey, _ := lock.RedisKeys(b.lockName(tt.name))
			require.Zero(t, b.rdb.Exists(ctx, lockKey).Val(), "released")
			require.Equal(t, map[bool]int64{true: 1, false: 0}[tt.cached], b.rdb.Exists(ctx, b.markKey(tt.name)).Val())
		})
	}
}

// An entry of another job reusing the key is no hit: the handler runs (the
// inbox judges the conflict) under the lock, and an entry is written only
// if it completes.
func TestLockCache_OtherFingerprintIsNoHit(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupLockCache(t, nil)
	require.NoError(t, b.rdb.Set(ctx, b.markKey("order-2"), "6f74686572", time.Minute).Err())

	calls := 0
	d := keyedDelivery("order-2")
	err := b.run(ctx, d, countingHandler(&calls, retry.Permanent(retry.ErrKeyConflict)))
	require.ErrorIs(t, err, retry.ErrKeyConflict)
	require.Equal(t, 1, calls)
	require.Equal(t, middleware.LockAcquired, d.LockResult)
	require.Equal(t, "6f74686572", b.rdb.Get(ctx, b.markKey("order-2")).Val(), "a conflict writes nothing")

	require.NoError(t, b.run(ctx, keyedDelivery("order-2"), countingHandler(&calls, nil)))
	require.Equal(t, cacheValue(d), b.rdb.Get(ctx, b.markKey("order-2")).Val())
}

// A delivery without a fingerprint is only locked, as Cache lets it pass.
func TestLockCache_NoFingerprintIsOnlyLocked(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupLockCache(t, nil)
	d := keyedDelivery("order-3")
	d.Fingerprint = nil
	calls := 0
	require.NoError(t, b.run(ctx, d, countingHandler(&calls, nil)))
	require.Equal(t, 1, calls)
	require.Equal(t, middleware.LockAcquired, d.LockResult)
	require.Zero(t, b.rdb.Exists(ctx, b.markKey("order-3")).Val())
}

// A key another worker holds is deferred, and nothing is cached.
func TestLockCache_HeldIsDeferredNotCached(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupLockCache(t, nil)
	lockKey, _ := lock.RedisKeys(b.lockName("order-4"))
	require.NoError(t, b.rdb.Set(ctx, lockKey, "another-worker", time.Minute).Err())

	calls := 0
	d := keyedDelivery("order-4")
	err := b.run(ctx, d, countingHandler(&calls, nil))
	require.Zero(t, calls)
	dec := retry.Classify(err)
	require.Equal(t, retry.KindRetry, dec.Kind)
	require.True(t, dec.Uncounted, "a deferral spends no attempt")
	require.Equal(t, middleware.ReasonLockUnavailable, dec.Reason)
	require.Equal(t, middleware.LockHeld, d.LockResult)
	require.Zero(t, b.rdb.Exists(ctx, b.markKey("order-4")).Val())
	require.Equal(t, "another-worker", b.rdb.Get(ctx, lockKey).Val())
}

// A lock lost while the handler ran does not stop a completed job's entry.
func TestLockCache_LostLockStillCachesACompletion(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupLockCache(t, nil)
	lockKey, _ := lock.RedisKeys(b.lockName("order-5"))
	d := keyedDelivery("order-5")
	err := b.run(ctx, d, func(context.Context, *inboxtype.Delivery) error {
		return b.rdb.Set(ctx, lockKey, "successor", time.Minute).Err()
	})
	require.NoError(t, err)
	require.Equal(t, "successor", b.rdb.Get(ctx, lockKey).Val(), "compare-and-delete spares the successor")
	require.Equal(t, cacheValue(d), b.rdb.Get(ctx, b.markKey("order-5")).Val())
}

// Redis down: the handler runs without lock or cache, and the lock reports
// the change once each way; once Redis answers, both are back.
func TestLockCache_DegradedProceedsWithoutEither(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	hook, events := degradedHook()
	b := setupLockCache(t, &middleware.LockOpts{CallTimeout: 50 * time.Millisecond, ProbeInterval: -1, OnDegraded: hook})
	require.NoError(t, b.rdb.Set(ctx, b.markKey("order-6"), cacheValue(keyedDelivery("order-6")), time.Minute).Err())

	b.flaky.Fail.Store(true)
	calls := 0
	for range 3 {
		d := keyedDelivery("order-6")
		require.NoError(t, b.run(ctx, d, countingHandler(&calls, nil)), "the inbox decides alone")
		require.Equal(t, middleware.LockDegraded, d.LockResult)
	}
	require.Equal(t, 3, calls)
	require.True(t, testenv.WaitChan(t, events, "OnDegraded(true)"))
	require.Empty(t, events, "one call per change")

	b.flaky.Fail.Store(false)
	d := keyedDelivery("order-7")
	require.NoError(t, b.run(ctx, d, countingHandler(&calls, nil)))
	require.Equal(t, middleware.LockAcquired, d.LockResult)
	require.False(t, testenv.WaitChan(t, events, "OnDegraded(false)"))
	require.Equal(t, cacheValue(d), b.rdb.Get(ctx, b.markKey("order-7")).Val())
	err := b.run(ctx, keyedDelivery("order-6"), countingHandler(&calls, nil))
	require.ErrorIs(t, err, retry.ErrDuplicate, "the cache answers again")
	require.Equal(t, 4, calls)
}

// On a Redis Cluster (which refuses a script whose keys hash apart with
// CROSSSLOT): the first delivery is locked and cached, its redelivery is a
// cache duplicate, and no call degrades.
func TestLockCache_OnRedisCluster(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	node := redistest.StartCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{node.Addr()}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	require.ErrorContains(t, rdb.Eval(ctx, `return redis.call("MGET", KEYS[1], KEYS[2])`, []string{"a", "b"}).Err(), "CROSSSLOT")

	degraded := false
	onDegraded := func(d bool) { degraded = degraded || d }
	cache := middleware.Cache(rdb, &middleware.CacheOpts{OnDegraded: onDegraded})
	lck := mustLock(t, rdb, &middleware.LockOpts{OnDegraded: onDegraded})
	mw := func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler { return cache(lck(next)) }
	for _, key := range []string{"order-1", "has{braces}inside", "trailing}"} {
		calls := 0
		d := keyedDelivery(key)
		require.NoError(t, mw(countingHandler(&calls, nil))(ctx, d), key)
		require.Equal(t, middleware.LockAcquired, d.LockResult, key)
		entry := "inboxmq:done:svc:" + key
		require.Equal(t, cacheValue(d), rdb.Get(ctx, entry).Val(), key)

		err := mw(countingHandler(&calls, nil))(ctx, keyedDelivery(key))
		require.Equal(t, retry.SourceCache, retry.Classify(err).Source, key)
		require.Equal(t, 1, calls, key)
	}
	require.False(t, degraded, "every script ran on the cluster")
}
