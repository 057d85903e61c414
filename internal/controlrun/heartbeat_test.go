package controlrun_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/internal/controlrun"
	"github.com/inboxmq/inboxmq/internal/logtest"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// workerByID reads the presence rows and returns the one of id.
func workerByID(t *testing.T, s *control.Store, id string) (control.Presence, bool) {
	t.Helper()
	ws, err := s.Workers(t.Context())
	require.NoError(t, err)
	for _, w := range ws {
		if w.ID == id {
			return w, true
		}
	}
	return control.Presence{}, false
}

// A heartbeat announces its worker at start, refreshes last_seen while it
// runs, marks the row stopped (and keeps it) on stop, and prunes rows not
// seen for a week; a row whose heartbeats stopped without a stop is stale.
func TestHeartbeat_AnnouncesRefreshesAndMarksStopped(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := pgtest.Schema(t)
	s := control.NewStore(pool)
	_, err := pool.Exec(ctx, `INSERT INTO inboxmq_workers (id, host, pid, namespaces, version, controls, last_seen) VALUES
		('gone', 'h0', 1, '{payments}', '0.0.1', true, now() - interval '8 days'),
		('frozen', 'h0', 2, '{payments}', '0.0.1', true, now() - interval '1 minute')`)
	require.NoError(t, err)

	me := control.Presence{ID: "w1", Host: "host-a", PID: 42, Namespaces: []string{"payments", "refunds"}, Version: "1.2.3", Controls: true}
	h := controlrun.NewHeartbeat(pool, me, nil)
	controlrun.SetHeartbeatInterval(h, 10*time.Millisecond)
	require.NoError(t, h.Start(ctx))

	w, ok := workerByID(t, s, "w1")
	require.True(t, ok, "Start wrote the row")
	require.Equal(t, "live", w.State)
	require.Equal(t, "host-a", w.Host)
	require.Equal(t, 42, w.PID)
	require.Equal(t, []string{"payments", "refunds"}, w.Namespaces)
	require.Equal(t, "1.2.3", w.Version)
	require.True(t, w.Controls)
	require.Nil(t, w.StoppedAt)
	frozen, ok := workerByID(t, s, "frozen")
	require.True(t, ok)
	require.Equal(t, "stale", frozen.State)
	_, ok = workerByID(t, s, "gone")
	require.False(t, ok, "a row not seen for a week is pruned")

	testenv.WaitFor(t, "the heartbeat refreshes last_seen", func() bool {
		now, _ := workerByID(t, s, "w1")
		return now.LastSeen.After(w.LastSeen)
	})
	require.NoError(t, h.Stop(ctx))
	stopped, ok := workerByID(t, s, "w1")
	require.True(t, ok, "a stopped worker's row is kept")
	require.Equal(t, "stopped", stopped.State)
	require.NotNil(t, stopped.StoppedAt)
	require.Equal(t, w.StartedAt, stopped.StartedAt)

	// The same worker started again takes its row back.
	again := controlrun.NewHeartbeat(pool, me, nil)
	require.NoError(t, again.Start(ctx))
	t.Cleanup(func() { require.NoError(t, again.Stop(context.Background())) })
	back, _ := workerByID(t, s, "w1")
	require.Equal(t, "live", back.State)
	require.Nil(t, back.StoppedAt)
	require.True(t, back.StartedAt.After(w.StartedAt), "a new start")
}

// A heartbeat that cannot write is not fatal: Start succeeds, the failure
// is logged once, and the beats go on until one succeeds.
func TestHeartbeat_FailureIsLoggedAndRetried(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := pgtest.Schema(t)
	_, err := pool.Exec(ctx, `ALTER TABLE inboxmq_workers RENAME TO inboxmq_workers_away`)
	require.NoError(t, err)
	logger, logs := logtest.New(slog.LevelDebug)
	h := controlrun.NewHeartbeat(pool, control.Presence{ID: "w1", Host: "h", PID: 1, Version: "1.2.3"}, logger)
	controlrun.SetHeartbeatInterval(h, 10*time.Millisecond)
	require.NoError(t, h.Start(ctx), "a failed heartbeat never stops the worker")
	t.Cleanup(func() { require.NoError(t, h.Stop(context.Background())) })
	require.Len(t, logs.Message("controlrun: worker heartbeat failed; retrying"), 1)

	_, err = pool.Exec(ctx, `ALTER TABLE inboxmq_workers_away RENAME TO inboxmq_workers`)
	require.NoError(t, err)
	s := control.NewStore(pool)
	testenv.WaitFor(t, "a later beat writes the row", func() bool {
		_, ok := workerByID(t, s, "w1")
		return ok
	})
	testenv.WaitFor(t, "the recovery is logged", func() bool {
		return len(logs.Message("controlrun: worker heartbeat recovered")) == 1
	})
	// Until it recovered, the failing heartbeat logged once, not at every
	// beat (a later beat may fail anew under load: that is logged again).
	failures := 0
	for _, e := range logs.All() {
		if e.Message == "controlrun: worker heartbeat recovered" {
			break
		}
		if e.Message == "controlrun: worker heartbeat failed; retrying" {
			failures++
		}
	}
	require.Equal(t, 1, failures, "logged once, not at every beat")
	w, _ := workerByID(t, s, "w1")
	require.False(t, w.Controls)
	require.Empty(t, w.Namespaces)
}

// A peer that stops refreshing its presence without a graceful stop is
// reported by the others: a warning naming it, and the count to OnStale;
// once it stops gracefully (or comes back) the count drops and that is
// logged too. A peer stopped gracefully, or stale for longer than the
// reporting window, is not reported.
func TestHeartbeat_ReportsPeersThatStoppedRefreshing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := pgtest.Schema(t)
	_, err := pool.Exec(ctx, `INSERT INTO inboxmq_workers (id, host, pid, namespaces, version, controls, last_seen, stopped_at) VALUES
		('killed', 'h1', 7, '{payments}', '0.0.1', true, now() - interval '1 minute', NULL),
		('long-ago', 'h1', 8, '{payments}', '0.0.1', true, now() - interval '1 hour', NULL),
		('graceful', 'h1', 9, '{payments}', '0.0.1', true, now() - interval '1 minute', now() - interval '1 minute')`)
	require.NoError(t, err)

	logger, logs := logtest.New(slog.LevelDebug)
	var stale atomic.Int64
	stale.Store(-1)
	h := controlrun.NewHeartbeat(pool, control.Presence{ID: "w1", Host: "h", PID: 1, Version: "1.2.3"}, logger)
	h.OnStale = func(n int) { stale.Store(int64(n)) }
	controlrun.SetHeartbeatInterval(h, 10*time.Millisecond)
	require.NoError(t, h.Start(ctx))
	t.Cleanup(func() { require.NoError(t, h.Stop(context.Background())) })

	require.Equal(t, int64(1), stale.Load(), "Start's beat counted the peers")
	warned := logs.Containing("stopped refreshing its presence")
	require.Len(t, warned, 1)
	require.Equal(t, "killed", warned[0].Attrs["peer"])
	require.Equal(t, slog.LevelWarn, warned[0].Level)

	_, err = pool.Exec(ctx, `UPDATE inboxmq_workers SET stopped_at = now() WHERE id = 'killed'`)
	require.NoError(t, err)
	testenv.WaitFor(t, "the count to drop to 0", func() bool { return stale.Load() == 0 })
	require.Len(t, logs.Containing("no longer is"), 1)
	require.Len(t, logs.Containing("stopped refreshing its presence"), 1, "reported once, not at every beat")
}
