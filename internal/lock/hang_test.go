package lock_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/lock"
	"github.com/inboxmq/inboxmq/internal/redistest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// hangBundle is a Batcher whose Redis connections go through a proxy that
// can hang, with a direct client for assertions.
type hangBundle struct {
	rdb    redis.UniversalClient // direct
	prefix string
	proxy  *redistest.Proxy
	locker *lock.Locker
	b      *lock.Batcher
}

func setupHang(t *testing.T, cfg *lock.Config) *hangBundle {
	t.Helper()
	rdb, prefix := redistest.Client(t)
	proxy := redistest.NewProxy(t)
	pc := proxy.Client(t)
	// Four idle connections, ready before the hang: commands sent during
	// it reach the proxy instead of waiting for a connection handshake.
	conns := make([]*redis.Conn, 4)
	for i := range conns {
		conns[i] = pc.(*redis.Client).Conn()
		require.NoError(t, conns[i].Ping(t.Context()).Err())
	}
	for _, c := range conns {
		require.NoError(t, c.Close())
	}
	locker, err := lock.New(pc, cfg)
	require.NoError(t, err)
	b, err := lock.NewBatcher(locker, &lock.BatcherOpts{RoundTimeout: 100 * time.Millisecond})
	require.NoError(t, err)
	// Load the scripts, so an obtain is one EVALSHA.
	l, err := b.Obtain(t.Context(), prefix+"warm", time.Minute)
	require.NoError(t, err)
	require.NoError(t, b.Release(t.Context(), l))
	return &hangBundle{rdb: rdb, prefix: prefix, proxy: proxy, locker: locker, b: b}
}

// abandon makes n obtains of prefix+"k<i>" while Redis hangs; each times
// out, and none is answered. It returns the lock keys.
func (h *hangBundle) abandon(t *testing.T, n int, ttl time.Duration) []string {
	t.Helper()
	h.proxy.Pause()
	keys := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		keys[i], _ = lock.RedisKeys(h.prefix + "k" + strconv.Itoa(i))
		wg.Go(func() {
			_, errs[i] = h.b.Obtain(t.Context(), h.prefix+"k"+strconv.Itoa(i), ttl)
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.Error(t, err)
		require.NotErrorIs(t, err, lock.ErrNotObtained, "Redis did not answer")
	}
	return keys
}

// existing counts the keys that exist.
func existing(ctx context.Context, rdb redis.UniversalClient, keys []string) int64 {
	return rdb.Exists(ctx, keys...).Val()
}

// An obtain that timed out while Redis hung, but that Redis ran when it
// answered again, leaves no lock behind: the next round trip of the
// Batcher releases it by its token.
func TestBatcher_AbandonedObtainIsReleased(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	h := setupHang(t, nil)
	keys := h.abandon(t, 4, time.Minute)

	h.proxy.Resume()
	testenv.WaitFor(t, "the abandoned obtains to run", func() bool { return existing(ctx, h.rdb, keys) > 0 })

	// Redis answers again: the next round trip cleans up.
	l, err := h.b.Obtain(ctx, h.prefix+"next", time.Minute)
	require.NoError(t, err)
	require.NoError(t, h.b.Release(ctx, l))
	waitWithin(t, 3*time.Second, "the abandoned locks to be released", func() bool {
		return existing(ctx, h.rdb, keys) == 0
	})
}

// waitWithin is testenv.WaitFor with a tighter bound, which is what the
// test asserts.
func waitWithin(t *testing.T, bound time.Duration, msg string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	testenv.WaitFor(t, msg, func() bool {
		ok := cond()
		require.True(t, ok || time.Now().Before(deadline), "not within %s: %s", bound, msg)
		return ok
	})
}

// With Config.Lease, an abandoned obtain whose release is lost too (no
// round trip follows, or the worker died) leaves a lock for the lease, not
// for the TTL asked for.
func TestBatcher_AbandonedObtainLivesForItsLease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	h := setupHang(t, &lock.Config{Lease: time.Second})
	keys := h.abandon(t, 2, time.Minute)
	require.Equal(t, 2, h.b.Unsettled(), "both obtains are remembered for release")

	h.proxy.Resume()
	testenv.WaitFor(t, "the abandoned obtains to run", func() bool { return existing(ctx, h.rdb, keys) > 0 })
	for _, k := range keys {
		require.LessOrEqual(t, h.rdb.PTTL(ctx, k).Val(), time.Second, "set for the lease")
	}
	waitWithin(t, 3*time.Second, "the abandoned locks to expire", func() bool {
		return existing(ctx, h.rdb, keys) == 0
	})
}

// A lock obtained with a lease shorter than its TTL lives for the lease
// until the keep-alive's first refresh, which comes within a third of the
// lease and extends it to the TTL.
func TestKeepAlive_ExtendsALease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	rdb, prefix := redistest.Client(t)
	locker, err := lock.New(rdb, &lock.Config{Lease: 900 * time.Millisecond})
	require.NoError(t, err)
	l, err := locker.Obtain(ctx, prefix+"k", time.Minute, nil)
	require.NoError(t, err)
	ttl, err := l.TTL(ctx)
	require.NoError(t, err)
	require.LessOrEqual(t, ttl, 900*time.Millisecond)

	kctx, stop := l.KeepAlive(ctx, nil)
	waitWithin(t, 600*time.Millisecond, "the first refresh to set the TTL", func() bool {
		ttl, err := l.TTL(ctx)
		return err == nil && ttl > 50*time.Second
	})
	stop()
	require.ErrorIs(t, context.Cause(kctx), context.Canceled, "stopped, not lost")
	require.NoError(t, l.Release(ctx))

	_, err = lock.New(rdb, &lock.Config{Lease: -time.Second})
	require.ErrorContains(t, err, "Lease must be 0 or at least 1ms")
}
