package chaos_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/chaos"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/redistest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// helperEnv makes the test binary act as a stand-in worker: it opens a
// broker connection, prints "connected", and exits 0 once the broker closes
// the connection (exit 3 if that takes longer than the test timeout).
const helperEnv = "INBOXCHAOS_TEST_HELPER"

func helperProcess() int {
	conn, err := amqp.DialConfig(testenv.AMQPURL(), amqp.Config{Properties: amqp.Table{"connection_name": "inboxchaos-helper"}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	fmt.Println("connected")
	select {
	case <-closed:
		return 0
	case <-time.After(testenv.Timeout()):
		_ = conn.Close()
		return 3
	}
}

func TestCloseBrokerConnections(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	buf := make([]byte, len("connected\n"))
	_, err = out.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "connected", strings.TrimSpace(string(buf)))

	var n int
	// The broker lists a new connection a moment after the handshake.
	testenv.WaitFor(t, "the helper's connection is listed and closed", func() bool {
		n, err = chaos.CloseBrokerConnections(ctx, cmd.Process.Pid)
		require.NoError(t, err)
		return n > 0
	})
	require.Equal(t, 1, n)
	require.NoError(t, cmd.Wait(), "the helper saw its connection closed by the server")
}

func TestTerminateBackends(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	admin, schema := pgtest.Schema(t)
	app := "inboxchaos_test_" + strings.ReplaceAll(schema[len(schema)-8:], "_", "x")
	cfg, err := pgxpool.ParseConfig(pgtest.URL(schema) + "&application_name=" + app)
	require.NoError(t, err)
	cfg.MaxConns = 2
	victim, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(victim.Close)
	c1, err := victim.Acquire(ctx)
	require.NoError(t, err)
	defer c1.Release()
	c2, err := victim.Acquire(ctx)
	require.NoError(t, err)
	defer c2.Release()

	n, err := chaos.TerminateBackends(ctx, admin, app, 0)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	_, err = c1.Exec(ctx, "SELECT 1")
	require.Error(t, err, "the terminated backend's connection is dead")

	// pg_terminate_backend only signals: the backends leave a moment later.
	testenv.WaitFor(t, "the terminated backends are gone", func() bool {
		var left int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&left))
		return left == 0
	})
}

func TestFlushRedisKeys(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	rdb, prefix := redistest.Client(t)
	for i := range 30 {
		require.NoError(t, rdb.Set(ctx, fmt.Sprintf("inboxmq:lock:%sq:payment:%d", prefix, i), "x", time.Minute).Err())
	}
	other := prefix + "other"
	require.NoError(t, rdb.Set(ctx, "kept:"+other, "x", time.Minute).Err())

	n, err := chaos.FlushRedisKeys(ctx, rdb, prefix+"q")
	require.NoError(t, err)
	require.Equal(t, 30, n)
	keys, err := rdb.Keys(ctx, "*"+prefix+"*").Result()
	require.NoError(t, err)
	require.Equal(t, []string{"kept:" + other}, keys)

	_, err = chaos.FlushRedisKeys(context.Background(), rdb, "")
	require.Error(t, err, "an empty pattern would flush everything")
}
