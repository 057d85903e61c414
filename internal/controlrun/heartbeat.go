package controlrun

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

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

// beat upserts the worker's row as live; fresh marks a new start
// (started_at now). It also deletes the rows of other workers not seen
// for pruneAfter.
const beat = `
WITH pruned AS (
    DELETE FROM inboxmq_workers WHERE id <> $1 AND last_seen < now() - $8 * interval '1 second'
)
INSERT INTO inboxmq_workers AS w (id, host, pid, namespaces, version, controls, started_at, last_seen, stopped_at)
VALUES ($1, $2, $3, $4, $5, $6, now(), now(), NULL)
ON CONFLICT (id) DO UPDATE SET
    host = excluded.host, pid = excluded.pid, namespaces = excluded.namespaces,
    version = excluded.version, controls = excluded.controls,
    started_at = CASE WHEN $7 THEN now() ELSE w.started_at END,
    last_seen = now(), stopped_at = NULL`

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

	fresh     bool        // the next successful beat starts the row (only the loop's goroutine after Start)
	failed    error       // the last beat's error, logged once
	announced atomic.Bool // Start ran: Stop marks the row stopped

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

// beat writes the row once, bounded by one interval.
func (h *Heartbeat) beat(ctx context.Context) {
	bctx, cancel := context.WithTimeout(ctx, h.interval)
	defer cancel()
	r := h.row
	_, err := h.db.Exec(bctx, beat, r.ID, r.Host, r.PID, r.Namespaces, r.Version, r.Controls, h.fresh, int64(pruneAfter.Seconds()))
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
	}
}
