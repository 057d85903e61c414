package inboxmq_test

import (
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/internal/redistest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// Against a real Sentinel (password-protected, as is its primary): the
// client RedisFromURL builds asks the Sentinel for the primary and writes
// there; a wrong Sentinel password fails with an error that shows no
// password.
func TestRedisFromURL_Sentinel(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	primary := redistest.StartServer(t, "data-pw", "")
	sentinel := redistest.StartSentinel(t, "mymaster", primary, "data-pw", "sentinel-pw")

	rdb, err := inboxmq.RedisFromURL(fmt.Sprintf("redis+sentinel://:data-pw@%s/mymaster/2?sentinel_password=sentinel-pw", sentinel.Addr()), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	require.NoError(t, rdb.Set(ctx, "k", "v", 0).Err())

	direct := redis.NewClient(&redis.Options{Addr: primary.Addr(), Password: "data-pw", DB: 2})
	t.Cleanup(func() { _ = direct.Close() })
	require.Equal(t, "v", direct.Get(ctx, "k").Val(), "written to the primary the Sentinel names, database 2")

	bad, err := inboxmq.RedisFromURL(fmt.Sprintf("redis+sentinel://:data-pw@%s/mymaster?sentinel_password=wrong-pw", sentinel.Addr()), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = bad.Close() })
	err = bad.Ping(ctx).Err()
	require.Error(t, err)
	require.NotContains(t, err.Error(), "data-pw")
	require.NotContains(t, err.Error(), "wrong-pw")
}

// Against a real Redis Cluster node.
func TestRedisFromURL_Cluster(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	node := redistest.StartCluster(t)
	rdb, err := inboxmq.RedisFromURL("redis+cluster://"+node.Addr(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	_, ok := rdb.(*redis.ClusterClient)
	require.True(t, ok, "a cluster client")
	require.NoError(t, rdb.Set(ctx, "k", "v", 0).Err())
	require.Equal(t, "v", rdb.Get(ctx, "k").Val())
}

// A Sentinel fail-over: the client RedisFromURL builds follows the
// Sentinel to the promoted replica, and writes land there.
func TestRedisFromURL_SentinelFailover(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	primary := redistest.StartServer(t, "pw", "masterauth pw\n")
	replica := redistest.StartServer(t, "pw", fmt.Sprintf("masterauth pw\nreplicaof 127.0.0.1 %d\n", primary.Port))
	sentinel := redistest.StartSentinel(t, "mymaster", primary, "pw", "")
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel.Addr()})
	t.Cleanup(func() { _ = sc.Close() })
	testenv.WaitFor(t, "the Sentinel knows the replica", func() bool {
		rs, err := sc.Replicas(ctx, "mymaster").Result()
		return err == nil && len(rs) == 1 && rs[0]["flags"] == "slave" && rs[0]["master-link-status"] == "ok"
	})

	rdb, err := inboxmq.RedisFromURL(fmt.Sprintf("redis+sentinel://:pw@%s/mymaster", sentinel.Addr()), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	require.NoError(t, rdb.Set(ctx, "before", "1", 0).Err())

	require.NoError(t, sc.Failover(ctx, "mymaster").Err())
	testenv.WaitFor(t, "the client writes to the promoted replica", func() bool {
		if rdb.Set(ctx, "after", "2", 0).Err() != nil {
			return false
		}
		direct := redis.NewClient(&redis.Options{Addr: replica.Addr(), Password: "pw"})
		defer direct.Close()
		role, err := direct.Do(ctx, "ROLE").Slice()
		return err == nil && len(role) > 0 && role[0] == "master" && direct.Get(ctx, "after").Val() == "2"
	})
	require.Equal(t, "1", rdb.Get(ctx, "before").Val(), "replicated before the fail-over")
}
