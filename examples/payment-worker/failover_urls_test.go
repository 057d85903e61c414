package main

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/redistest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// DATABASE_URL may list several hosts: a host that does not answer is
// skipped and the pool reaches the primary behind it.
func TestOpenPool_MultiHostURL(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testenv.DatabaseURL())
	require.NoError(t, err)
	u.Host = "127.0.0.1:9," + u.Host // nothing listens on the discard port
	cfg := config{DatabaseURL: u.String(), Concurrency: 2, ConnectTimeout: 5 * time.Second}
	pool, err := openPool(cfg, &tracing{})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var readOnly string
	require.NoError(t, pool.QueryRow(t.Context(), `SHOW transaction_read_only`).Scan(&readOnly))
	require.Equal(t, "off", readOnly)

	_, err = openPool(config{DatabaseURL: "postgres://postgres:pg-secret@127.0.0.1:9,127.0.0.1:5432/db?target_session_attrs=standby"}, &tracing{})
	require.ErrorContains(t, err, "target_session_attrs=standby")
	require.NotContains(t, err.Error(), "pg-secret")
}

// REDIS_URL may name a Sentinel set; a bad one is an error naming
// REDIS_URL without its password.
func TestRedisClient_SentinelURL(t *testing.T) {
	t.Parallel()
	primary := redistest.StartServer(t, "", "")
	sentinel := redistest.StartSentinel(t, "payments", primary, "", "")
	rdb, err := redisClient(fmt.Sprintf("redis+sentinel://%s/payments/3", sentinel.Addr()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	require.NoError(t, rdb.Set(t.Context(), "k", "v", 0).Err())

	_, err = redisClient("redis+sentinel://:redis-secret@127.0.0.1:26379")
	require.ErrorContains(t, err, "REDIS_URL")
	require.ErrorContains(t, err, "master set's name")
	require.NotContains(t, err.Error(), "redis-secret")
}
