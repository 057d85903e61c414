package controlrun

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/internal/startstop"
)

// A worker's heartbeat refreshes its presence row every heartbeatInterval
// (control.Store.Workers counts a row live for three of them, 15s). Rows
// not seen for pruneAfter are deleted by the heartbeats of the workers
// still running.
const (
	heartbeatInterval = 5 * time.Second
	pruneAfter        = 7 * 24 * time.Hour
)

// A peer is reported stale from staleAfter without a refresh (three
// heartbeats, control.Store.Workers' "stale") until reportStaleFor: past
// that it is history (inboxctl workers still lists it until pruneAfter).
const (
	staleAfter     = 15 * time.Second
	reportStaleFor = 15 * time.Minute
)

// beat upserts the worker's row as live; fresh marks a new start
// (started_at now). It also deletes the rows of other workers not seen
// for pruneAfter, and returns the peers that stopped refreshing their
// rows without a graceful stop (stale since staleAfter, within
// reportStaleFor).
const beat = `
WITH pruned AS (
    DELETE FROM inboxmq_workers WHERE id <> $1 AND last_seen < now() - $8 * interval '1 second'
), up AS (
    INSERT INTO inboxmq_workers AS w (id, host, pid, namespaces, version, controls, started_at, last_seen, stopped_at)
    VALUES ($1, $2, $3, $4, $5, $6, now(), now(), NULL)
    ON CONFLICT (id) DO UPDATE SET
        host = excluded.host, pid = excluded.pid, namespaces = excluded.namespaces,
        version = excluded.version, controls = excluded.controls,
        started_at = CASE WHEN $7 THEN now() ELSE w.started_at END,
        last_seen = now(), stopped_at = NULL
)
SELECT id, host, pid, extract(epoch FROM now() - last_seen)::float8 FROM inboxmq_workers
WHERE id <> $1 AND stopped_at IS NULL
    AND last_seen < now() - $9 * interval '1 millisecond' AND last_seen > now() - $10 * interval '1 millisecond'
ORDER BY id`

// Heartbeat announces a worker process in PostgreSQL (table
// inboxmq_workers) so that inboxctl and the console can tell who obeys a
// control: Start writes its row, a background loop refreshes it every 5
// seconds (the row is live while it is seen within 15), and Stop marks it
// stopped and keeps it. The heartbeats also delete rows not seen for 7
// days. A failed write is logged (once until one succeeds again) and
// retried on the next beat: it never stops the worker.
type Heartbeat struct {
	db       control.DB
	row      control.Presence
	logger   *slog.Logger
	interval time.Duration

	fresh     bool            // the next successful beat starts the row (only the loop's goroutine after Start)
	failed    error           // the last beat's error, logged once
	stale     map[string]bool // the peers reported stale (the loop's goroutine)
	announced atomic.Bool     // Start ran: Stop marks the row stopped

	// OnStale, if set before Start, is told after each beat how many peers
	// have stopped refreshing their presence (the workers_stale gauge).
	OnStale func(n int)

	svc startstop.Service
}

// NewHeartbeat returns a heartbeat writing p (its State and times are
// ignored) through db. A nil logger discards its lines.
func NewHeartbeat(db control.DB, p control.Presence, logger *slog.Logger) *Heartbeat {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if p.Namespaces == nil {
		p.Namespaces = []string{}
	}
	return &Heartbeat{
		db: db, row: p, logger: logger, interval: heartbeatInterval,
		svc: startstop.Service{Name: "controlrun: heartbeat"},
	}
}

// Start writes the worker's row (bounded by ctx; a failure is logged, not
// returned) and starts the loop that refreshes it.
func (h *Heartbeat) Start(ctx context.Context) error {
	return h.svc.Start(ctx, func(ctx context.Context) error {
		h.fresh, h.failed = true, nil
		h.announced.Store(true)
		h.beat(ctx)
		return nil
	}, h.run)
}

// Stop ends the loop and marks the row stopped, bounded by ctx. A failure
// to mark it is logged; the row then turns stale by itself.
func (h *Heartbeat) Stop(ctx context.Context) error {
	err := h.svc.Stop(ctx)
	if !h.announced.Swap(false) {
		return err
	}
	_, uerr := h.db.Exec(ctx, `UPDATE inboxmq_workers SET stopped_at = now(), last_seen = now()
		WHERE id = $1 AND host = $2 AND pid = $3 AND stopped_at IS NULL`, h.row.ID, h.row.Host, h.row.PID)
	if uerr != nil {
		h.logger.LogAttrs(ctx, slog.LevelWarn, "controlrun: marking the worker stopped failed",
			slog.String("worker", h.row.ID), slog.Any("error", uerr))
	}
	return err
}

// minBeatTimeout is the least bound of one beat.
const minBeatTimeout = 2 * time.Second

func (h *Heartbeat) run(ctx context.Context) error {
	t := time.NewTicker(h.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		h.beat(ctx)
	}
}

// beat writes the row once, bounded by one interval, and by at least
// minBeatTimeout: a short interval (tests use 10ms) must not fail every
// beat of a loaded machine, Start's included.
func (h *Heartbeat) beat(ctx context.Context) {
	bctx, cancel := context.WithTimeout(ctx, max(h.interval, minBeatTimeout))
	defer cancel()
	r := h.row
	var peers []stalePeer
	rows, err := h.db.Query(bctx, beat, r.ID, r.Host, r.PID, r.Namespaces, r.Version, r.Controls, h.fresh,
		int64(pruneAfter.Seconds()), staleAfter.Milliseconds(), reportStaleFor.Milliseconds())
	if err == nil {
		peers, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (stalePeer, error) {
			var p stalePeer
			var secs float64
			err := row.Scan(&p.id, &p.host, &p.pid, &secs)
			p.ago = time.Duration(secs * float64(time.Second)).Round(time.Second)
			return p, err
		})
	}
	switch {
	case err != nil && ctx.Err() != nil:
		// Stopping: the loop ends.
	case err != nil:
		if h.failed == nil {
			h.logger.LogAttrs(ctx, slog.LevelWarn, "controlrun: worker heartbeat failed; retrying",
				slog.String("worker", r.ID), slog.Any("error", err))
		}
		h.failed = err
	default:
		if h.failed != nil {
			h.logger.LogAttrs(ctx, slog.LevelInfo, "controlrun: worker heartbeat recovered", slog.String("worker", r.ID))
		}
		h.fresh, h.failed = false, nil
		h.reportStale(ctx, peers)
	}
}

// stalePeer is a worker whose presence row stopped being refreshed.
type stalePeer struct {
	id, host string
	pid      int
	ago      time.Duration
}

// reportStale logs the peers that turned stale since the last beat, and
// those no longer stale (back, stopped, or past reportStaleFor), and
// tells OnStale how many are.
func (h *Heartbeat) reportStale(ctx context.Context, peers []stalePeer) {
	now := make(map[string]bool, len(peers))
	for _, p := range peers {
		now[p.id] = true
		if !h.stale[p.id] {
			h.logger.LogAttrs(ctx, slog.LevelWarn,
				"controlrun: a worker stopped refreshing its presence: it crashed, froze or lost PostgreSQL, and its deliveries return to the queue",
				slog.String("peer", p.id), slog.String("peer_host", p.host), slog.Int("peer_pid", p.pid),
				slog.Duration("last_seen_ago", p.ago), slog.String("worker", h.row.ID))
		}
	}
	for id := range h.stale {
		if !now[id] {
			h.logger.LogAttrs(ctx, slog.LevelInfo, "controlrun: a worker reported stale no longer is (back, stopped or aged out)",
				slog.String("peer", id), slog.String("worker", h.row.ID))
		}
	}
	h.stale = now
	if h.OnStale != nil {
		h.OnStale(len(peers))
	}
}
