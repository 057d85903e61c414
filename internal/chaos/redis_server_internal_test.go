package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/redistest"
)

// The redis-restart fault restarts the run's own server, empty, on its own
// port; the shared Redis keeps its keys.
func TestRedisServer_RestartLeavesTheSharedRedisAlone(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	shared, prefix := redistest.Client(t)
	require.NoError(t, shared.Set(ctx, prefix+"canary", "1", 0).Err())

	srv, err := startRedisServer(ctx, t.TempDir())
	require.NoError(t, err)
	t.Cleanup(srv.stop)
	opts, err := redis.ParseURL(srv.URL())
	require.NoError(t, err)
	own := redis.NewClient(opts)
	t.Cleanup(func() { _ = own.Close() })
	require.NoError(t, own.Set(ctx, "k", "v", 0).Err())

	require.NoError(t, srv.restart(ctx, 10*time.Millisecond))
	require.ErrorIs(t, own.Get(ctx, "k").Err(), redis.Nil, "the run's own server came back empty")
	got, err := shared.Get(context.Background(), prefix+"canary").Result()
	require.NoError(t, err, "the shared Redis was not restarted")
	require.Equal(t, "1", got)

	pid := srv.cmd.Process.Pid
	srv.stop()
	require.Error(t, own.Ping(ctx).Err(), "stopped by its PID %d", pid)
}
