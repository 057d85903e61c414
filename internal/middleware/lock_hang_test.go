package middleware_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/middleware"
	"github.com/inboxmq/inboxmq/internal/redistest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// A Redis that hangs (not one that refuses) while deliveries take locks:
// the deliveries proceed without the lock, and once Redis answers again,
// the obtains they gave up on leave no lock behind for longer than a few
// seconds, so a later delivery of the same key is not held out for the
// lock's TTL.
func TestLock_RedisHangLeavesNoOrphanLock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupRedis(t)
	proxy := redistest.NewProxy(t)
	pc := proxy.Client(t)
	// Idle connections ready before the hang, as a busy worker has them:
	// the obtains sent during the hang reach the (hung) server.
	conns := make([]*redis.Conn, 4)
	for i := range conns {
		conns[i] = pc.(*redis.Client).Conn()
		require.NoError(t, conns[i].Ping(ctx).Err())
	}
	for _, c := range conns {
		require.NoError(t, c.Close())
	}
	mw, err := middleware.Lock(pc, &middleware.LockOpts{
		Prefix:        b.prefix,
		TTL:           30 * time.Second,
		CallTimeout:   100 * time.Millisecond,
		ProbeInterval: 100 * time.Millisecond,
	})
	require.NoError(t, err)
	deliver := func(key string) *inboxtype.Delivery {
		d := keyedDelivery(key)
		_ = mw(func(context.Context, *inboxtype.Delivery) error { return nil })(ctx, d)
		return d
	}
	require.Equal(t, middleware.LockAcquired, deliver("warm").LockResult)

	// Redis hangs while four deliveries take their locks: each proceeds
	// without one.
	proxy.Pause()
	const n = 4
	keys := make([]string, n)
	results := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		keys[i] = redisLockKey(b.prefix, "o"+strconv.Itoa(i))
		wg.Go(func() { results[i] = deliver("o" + strconv.Itoa(i)).LockResult })
	}
	wg.Wait()
	for _, r := range results {
		require.Equal(t, middleware.LockDegraded, r)
	}

	// Redis answers again, and runs the obtains it was sent meanwhile.
	proxy.Resume()
	testenv.WaitFor(t, "the abandoned obtains to run", func() bool { return b.rdb.Exists(ctx, keys...).Val() > 0 })

	// The worker goes on with other keys; within seconds (the TTL is 30s)
	// no lock of the hang is left, and each key can be locked again.
	start := time.Now()
	bound := 7 * time.Second // the 5s lease, with room for a busy machine
	testenv.WaitFor(t, "the abandoned locks to go", func() bool {
		deliver("other")
		left := b.rdb.Exists(ctx, keys...).Val()
		require.True(t, left == 0 || time.Since(start) < bound, "%d orphan locks left after %s", left, bound)
		return left == 0
	})
	for i := range n {
		require.Equal(t, middleware.LockAcquired, deliver("o"+strconv.Itoa(i)).LockResult)
	}
}

// A handler that runs longer than the lease the obtain set keeps its lock:
// the keep-alive's first refresh extends it to the TTL.
func TestLock_LongHandlerKeepsLockPastLease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupRedis(t)
	mw := mustLock(t, b.flaky, &middleware.LockOpts{Prefix: b.prefix, TTL: 30 * time.Second})
	err := mw(func(ctx context.Context, d *inboxtype.Delivery) error {
		testenv.WaitFor(t, "the keep-alive to extend the lease to the TTL", func() bool {
			return b.rdb.PTTL(ctx, redisLockKey(b.prefix, "long")).Val() > 25*time.Second
		})
		return ctx.Err()
	})(ctx, keyedDelivery("long"))
	require.NoError(t, err)
}
