package control

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxmq/inboxmq/internal/startstop"
)

// A worker's heartbeat refreshes its presence row every heartbeatInterval;
// a row seen within liveFor of the database's clock is live. Rows not seen
// for pruneAfter are deleted by the heartbeats of the workers still
// running.
const (
	heartbeatInterval = 5 * time.Second
	liveFor           = 3 * heartbeatInterval
	pruneAfter        = 7 * 24 * time.Hour
)

// Presence is one worker process as it announced itself (table
// inboxmq_workers): which namespaces it serves and whether it obeys the
// runtime controls. A [Heartbeat] writes it; [Store.Workers] reads it.
type Presence struct {
	// ID names the worker process (its Config.Name, "<hostname>-<pid>" by
	// default). Two processes with one ID share one row.
	ID string `json:"id"`
	// Host and PID locate the process.
	Host string `json:"host"`
	PID  int    `json:"pid"`
	// Namespaces are the inbox namespaces (the controls' consumer names)
	// of the worker's routes.
	Namespaces []string `json:"namespaces"`
	// Version is the worker's inboxmq release.
	Version string `json:"version"`
	// Controls says whether the worker runs a [Watcher]: false means it
	// ignores pause, concurrency and blocks.
	Controls bool `json:"controls"`
	// StartedAt is when the worker announced itself; LastSeen its latest
	// heartbeat; StoppedAt, when set, when it stopped gracefully. Read
	// from the database, in its clock.
	StartedAt time.Time  `json:"started_at"`
	LastSeen  time.Time  `json:"last_seen"`
	StoppedAt *time.Time `json:"stopped_at,omitempty"`
	// State is "live" (seen within the last 15 seconds, three heartbeats),
	// "stale" (not seen since: crashed, frozen or cut off from the
	// database) or "stopped". Set by [Store.Workers]; a Heartbeat ignores
	// it.
	State string `json:"state"`
}

// Workers returns the workers' presence rows, ordered by ID: every worker
// running, stale or stopped within the last 7 days.
func (s *Store) Workers(ctx context.Context) ([]Presence, error) {
	rows, err := s.db.Query(ctx, `SELECT id, host, pid, namespaces, version, controls, started_at, last_seen, stopped_at,
		CASE WHEN stopped_at IS NOT NULL THEN 'stopped'
		     WHEN last_seen > now() - $1 * interval '1 millisecond' THEN 'live'
		     ELSE 'stale' END
		FROM inboxmq_workers ORDER BY id`, liveFor.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("control: list workers: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Presence, error) {
		var p Presence
		err := r.Scan(&p.ID, &p.Host, &p.PID, &p.Namespaces, &p.Version, &p.Controls, &p.StartedAt, &p.LastSeen, &p.StoppedAt, &p.State)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("control: list workers: %w", err)
	}
	return out, nil
}

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
	store    *Store
	row      Presence
	logger   *slog.Logger
	interval time.Duration

	fresh     bool        // the next successful beat starts the row (only the loop's goroutine after Start)
	failed    error       // the last beat's error, logged once
	announced atomic.Bool // Start ran: Stop marks the row stopped

	svc startstop.Service
}

// NewHeartbeat returns a heartbeat writing p (its State and times are
// ignored) through db. A nil logger discards its lines.
func NewHeartbeat(db DB, p Presence, logger *slog.Logger) *Heartbeat {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if p.Namespaces == nil {
		p.Namespaces = []string{}
	}
	return &Heartbeat{
		store: NewStore(db), row: p, logger: logger, interval: heartbeatInterval,
		svc: startstop.Service{Name: "control: heartbeat"},
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
	_, uerr := h.store.db.Exec(ctx, `UPDATE inboxmq_workers SET stopped_at = now(), last_seen = now()
		WHERE id = $1 AND host = $2 AND pid = $3 AND stopped_at IS NULL`, h.row.ID, h.row.Host, h.row.PID)
	if uerr != nil {
		h.logger.LogAttrs(ctx, slog.LevelWarn, "control: marking the worker stopped failed",
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
	_, err := h.store.db.Exec(bctx, beat, r.ID, r.Host, r.PID, r.Namespaces, r.Version, r.Controls, h.fresh, int64(pruneAfter.Seconds()))
	switch {
	case err != nil && ctx.Err() != nil:
		// Stopping: the loop ends.
	case err != nil:
		if h.failed == nil {
			h.logger.LogAttrs(ctx, slog.LevelWarn, "control: worker heartbeat failed; retrying",
				slog.String("worker", r.ID), slog.Any("error", err))
		}
		h.failed = err
	default:
		if h.failed != nil {
			h.logger.LogAttrs(ctx, slog.LevelInfo, "control: worker heartbeat recovered", slog.String("worker", r.ID))
		}
		h.fresh, h.failed = false, nil
	}
}
