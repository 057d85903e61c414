package main

import (
	"net/url"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
	pool, err := openPool(cfg, nil)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var readOnly string
	require.NoError(t, pool.QueryRow(t.Context(), `SHOW transaction_read_only`).Scan(&readOnly))
	require.Equal(t, "off", readOnly)

	_, err = openPool(config{DatabaseURL: "postgres://postgres:pg-secret@127.0.0.1:9,127.0.0.1:5432/db?target_session_attrs=standby"}, nil)
	require.ErrorContains(t, err, "target_session_attrs=standby")
	require.NotContains(t, err.Error(), "pg-secret")
}

// A bad REDIS_URL (a Sentinel URL without the master set's name) ends
// `run` at once with an error naming REDIS_URL, never its password.
func TestRunRefusesABadRedisURL(t *testing.T) {
	t.Parallel()
	cmd := exec.CommandContext(t.Context(), workerBinary(t), "run")
	cmd.Env = append(os.Environ(), "REDIS_URL=redis+sentinel://:redis-secret@127.0.0.1:26379", "METRICS_ADDR="+freeAddr(t))
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr, "%s", out)
	require.Equal(t, 1, exitErr.ExitCode())
	require.Contains(t, string(out), "payment-worker: REDIS_URL")
	require.Contains(t, string(out), "master set's name")
	require.NotContains(t, string(out), "redis-secret")
}
