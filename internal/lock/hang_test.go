package lock_test

import (
	"context"
	"errors"
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

// Obtains that timed out while Redis hung, but that Redis ran when it
// answered again, leave locks that nobody releases: each lives for the
// obtain's lease, not for the ttl asked for.
func TestObtain_AbandonedLivesForItsLease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	rdb, prefix := redistest.Client(t)
	proxy := redistest.NewProxy(t)
	pc := proxy.Client(t)
	// Idle connections, ready before the hang: the obtains sent during it
	// reach the proxy instead of waiting for a connection handshake.
	conns := make([]*redis.Conn, 2)
	for i := range conns {
		conns[i] = pc.(*redis.Client).Conn()
		require.NoError(t, conns[i].Ping(ctx).Err())
	}
	for _, c := range conns {
		require.NoError(t, c.Close())
	}
	// Load the script, so that an obtain is one EVALSHA.
	l, err := lock.Obtain(ctx, pc, prefix+"warm", time.Minute, 0)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))

	proxy.Pause()
	keys := make([]string, len(conns))
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	for i := range keys {
		name := prefix + "k" + strconv.Itoa(i)
		keys[i], _ = lock.RedisKeys(name)
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			_, errs[i] = lock.Obtain(cctx, pc, name, time.Minute, time.Second)
		})
	}
	wg.Wait()
	for _, err := range errs {
		// The context's deadline and the socket's (ContextTimeoutEnabled
		// sets one from the other) end together: either error says so.
		var timeout interface{ Timeout() bool }
		require.True(t, errors.Is(err, context.DeadlineExceeded) || errors.As(err, &timeout) && timeout.Timeout(), "a timeout: %v", err)
		require.NotErrorIs(t, err, lock.ErrNotObtained, "Redis did not answer")
	}

	proxy.Resume()
	testenv.WaitFor(t, "the abandoned obtains to run", func() bool { return rdb.Exists(ctx, keys...).Val() > 0 })
	for _, k := range keys {
		require.LessOrEqual(t, rdb.PTTL(ctx, k).Val(), time.Second, "set for the lease")
	}
	waitWithin(t, 3*time.Second, "the abandoned locks to expire", func() bool {
		return rdb.Exists(ctx, keys...).Val() == 0
	})
}

// A lock obtained with a lease shorter than its ttl lives for the lease
// until the keep-alive's first refresh, which comes within a third of the
// lease and extends it to the ttl.
func TestKeepAlive_ExtendsALease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	l, err := lock.Obtain(ctx, b.rdb, b.prefix+"k", time.Minute, 900*time.Millisecond)
	require.NoError(t, err)
	require.LessOrEqual(t, b.pttl(t, "k"), 900*time.Millisecond)

	kctx, stop := l.KeepAlive(ctx, 0, 0)
	waitWithin(t, 600*time.Millisecond, "the first refresh to set the ttl", func() bool {
		return b.pttl(t, "k") > 50*time.Second
	})
	stop()
	require.ErrorIs(t, context.Cause(kctx), context.Canceled, "stopped, not lost")
	require.NoError(t, l.Release(ctx))
}
