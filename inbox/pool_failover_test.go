package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/migrations"
	"github.com/inboxmq/inboxmq/retry"
)

// A real fail-over: a primary and a pg_basebackup -R standby of their own,
// a pool on the multi-host URL of both built through ConfigurePool. The
// old primary is fenced (its sessions turn read-only: an idle pooled
// connection's next write is refused with 25006) or stopped (a delivery
// in flight loses its connection, 57P01) and the standby is promoted.
// Every delivery of before is redelivered and is a duplicate, new ones
// commit once, all on the new primary, and every pool connection ends up
// there. "fenced" uses a URL without target_session_attrs, so only
// ConfigurePool's check keeps new connections off the fenced node;
// "stopped-group" has a group-commit batch in flight.
func TestConfigurePool_FailoverToPromotedStandby(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"fenced", "stopped", "stopped-group"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			testFailover(t, how)
		})
	}
}

func testFailover(t *testing.T, how string) {
	ctx := t.Context()
	primary := pgtest.StartPrimary(t)
	standby := primary.StartStandby(t)

	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5",
		primary.Port, standby.Port)
	stopped := how != "fenced"
	if stopped {
		url += "&target_session_attrs=read-write"
	}
	inFlightN := 1
	var hopts *inbox.GroupCommit
	if how == "stopped-group" {
		inFlightN = 4
		hopts = &inbox.GroupCommit{MaxBatch: inFlightN, MaxWait: 100 * time.Millisecond, MaxInFlight: 1}
	}
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 4
	require.NoError(t, inbox.ConfigurePool(cfg))
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, migrations.Up(ctx, pool))
	b := setupOn(t, pool, nil)

	entered, release := make(chan struct{}), make(chan struct{})
	var holding atomic.Bool
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if err := effectHandler(nil)(ctx, tx, msg); err != nil {
			return err
		}
		if strings.HasPrefix(msg.Body.OrderID, "in-flight") && !msg.Redelivered && holding.CompareAndSwap(false, true) {
			close(entered)
			<-release
		}
		return nil
	}, hopts)

	const before, after = 12, 8
	msgs := make([]*inboxtype.Message[order], 0, before)
	for i := range before {
		msgs = append(msgs, newMsg(t, "payments", order{OrderID: strconv.Itoa(i), Amount: 1}, false))
	}
	for i, err := range handleAll(t, h, msgs) {
		require.NoError(t, err, "delivery %d", i)
	}
	requireAllConnsOn(t, pool, primary.Port)

	var inFlight chan error
	if stopped {
		inFlight = make(chan error, inFlightN)
		for i := range inFlightN {
			m := newMsg(t, "payments", order{OrderID: "in-flight-" + strconv.Itoa(i), Amount: 1}, false)
			go func() { inFlight <- h.Handle(ctx, m) }()
		}
		testenv.WaitChan(t, entered, "the in-flight delivery wrote its effect")
	}

	// Fail over: the old primary stops taking writes, the standby has
	// every committed row and is promoted.
	admin := func(port int) *pgx.Conn {
		c, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port))
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	waitReplayed(t, admin(primary.Port), admin(standby.Port))
	failedOver := time.Now()
	switch how {
	case "fenced":
		pc := admin(primary.Port)
		_, err = pc.Exec(ctx, `ALTER SYSTEM SET default_transaction_read_only = on`)
		require.NoError(t, err)
		_, err = pc.Exec(ctx, `SELECT pg_reload_conf()`)
		require.NoError(t, err)
	default:
		primary.Stop(t)
		close(release)
		for range inFlightN {
			err := testenv.WaitChan(t, inFlight, "the in-flight delivery ended")
			require.Equal(t, retry.KindRetry, retry.Classify(err).Kind, "a delivery whose connection died is retried, not acked: %v", err)
		}
	}
	var promoted bool
	require.NoError(t, admin(standby.Port).QueryRow(ctx, `SELECT pg_promote()`).Scan(&promoted))
	require.True(t, promoted)

	// The broker redelivers everything of before; new deliveries come.
	redeliver := make([]*inboxtype.Message[order], 0, before+after+1)
	for i := range before {
		redeliver = append(redeliver, newMsg(t, "payments", order{OrderID: strconv.Itoa(i), Amount: 1}, true))
	}
	for i := range inFlightN * boolInt(stopped) {
		redeliver = append(redeliver, newMsg(t, "payments", order{OrderID: "in-flight-" + strconv.Itoa(i), Amount: 1}, true))
	}
	for i := range after {
		redeliver = append(redeliver, newMsg(t, "payments", order{OrderID: strconv.Itoa(before + i), Amount: 1}, false))
	}
	failed := 0
	var firstSettled time.Duration
	for _, m := range redeliver {
		tries, err := deliverUntilSettled(t, h, m)
		failed += tries - 1
		if firstSettled == 0 {
			firstSettled = time.Since(failedOver)
		}
		if n, aerr := strconv.Atoi(m.Body.OrderID); aerr == nil && n < before {
			require.ErrorIs(t, err, retry.ErrDuplicate, "redelivered %s", m.Key)
		} else {
			require.NoError(t, err, "new %s", m.Key)
		}
	}
	t.Logf("%s: first delivery settled on the new primary %s after the fail-over began (promotion included); %d attempts failed",
		how, firstSettled.Round(time.Millisecond), failed)
	require.LessOrEqual(t, failed, 3, "the pool retires its old connections at the first fail-over signal")

	want := before + after
	want += inFlightN * boolInt(stopped)
	nc := admin(standby.Port)
	count := func(sql string) int {
		var n int
		require.NoError(t, nc.QueryRow(ctx, sql).Scan(&n))
		return n
	}
	require.Equal(t, want, count(`SELECT count(*) FROM effects`), "one effect per key on the new primary")
	require.Equal(t, want, count(`SELECT count(DISTINCT key) FROM effects`))
	require.Equal(t, want, count(`SELECT count(*) FROM inboxmq_inbox WHERE status = 'completed'`))
	requireAllConnsOn(t, pool, standby.Port)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// deliverUntilSettled hands m to h as the broker would, again after each
// retryable failure, until it is acked (nil or a duplicate). It returns
// the number of attempts and the last error.
func deliverUntilSettled(t *testing.T, h inboxtype.Handler[order], m *inboxtype.Message[order]) (int, error) {
	t.Helper()
	deadline := time.Now().Add(testenv.Timeout())
	for tries := 1; ; tries++ {
		err := h.Handle(t.Context(), m)
		if err == nil || errors.Is(err, retry.ErrDuplicate) {
			return tries, err
		}
		require.Equal(t, retry.KindRetry, retry.Classify(err).Kind, "%s: %v", m.Key, err)
		require.True(t, time.Now().Before(deadline), "%s still failing: %v", m.Key, err)
		<-time.After(50 * time.Millisecond) // the retry tier's delay
	}
}

// requireAllConnsOn acquires every connection of pool and requires each
// to be on the server listening on port.
func requireAllConnsOn(t *testing.T, pool *pgxpool.Pool, port int) {
	t.Helper()
	var held []*pgxpool.Conn
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	for range pool.Config().MaxConns {
		c, err := pool.Acquire(t.Context())
		require.NoError(t, err)
		held = append(held, c)
		var got int
		require.NoError(t, c.QueryRow(t.Context(), `SELECT inet_server_port()`).Scan(&got))
		require.Equal(t, port, got)
	}
}

// waitReplayed waits until the standby has replayed every commit the
// primary acknowledged so far. The throwaway servers commit
// asynchronously (pgtest), so the last acknowledged commits may still sit
// in the primary's WAL buffers: pg_current_wal_lsn() (the write position)
// can be short of them, and a walsender ships only flushed WAL. A
// WAL-logged transaction committed synchronously flushes all WAL before
// its commit record, so the primary's flush position after it covers
// every commit acknowledged before; the wait is on the standby replaying
// that far (replay, not receive: a promotion keeps only what was
// replayed), bounded by testenv.WaitFor.
func waitReplayed(t *testing.T, primary, standby *pgx.Conn) {
	t.Helper()
	ctx := t.Context()
	_, err := primary.Exec(ctx, `SET synchronous_commit = on`)
	require.NoError(t, err)
	_, err = primary.Exec(ctx, `SELECT pg_logical_emit_message(true, 'inboxmq-test', 'replay mark')`)
	require.NoError(t, err)
	var lsn string
	require.NoError(t, primary.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&lsn))
	testenv.WaitFor(t, "the standby replayed the primary's WAL up to "+lsn, func() bool {
		var done bool
		err := standby.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, lsn).Scan(&done)
		return err == nil && done
	})
}
