package control

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// liveFor is how recently a presence row must have been seen, in the
// database's clock, to be live: three heartbeats (a worker's heartbeat
// refreshes its row every 5 seconds).
const liveFor = 15 * time.Second

// Presence is one worker process as it announced itself (table
// inboxmq_workers): which namespaces it serves and whether it obeys the
// runtime controls. Each worker's heartbeat writes it; [Store.Workers]
// reads it.
type Presence struct {
	// ID names the worker process (its Config.Name, "<hostname>-<pid>" by
	// default). Two processes with one ID share one row.
	ID string `json:"id"`
	// Host and PID locate the process.
	Host string `json:"host"`
	PID  int    `json:"pid"`
	// Namespaces are the inbox namespaces of the worker's routes.
	Namespaces []string `json:"namespaces"`
	// Version is the worker's inboxmq release.
	Version string `json:"version"`
	// Controls says whether the worker obeys the runtime controls: false
	// means it ignores pause, concurrency and blocks.
	Controls bool `json:"controls"`
	// StartedAt is when the worker announced itself; LastSeen its latest
	// heartbeat; StoppedAt, when set, when it stopped gracefully. Read
	// from the database, in its clock.
	StartedAt time.Time  `json:"started_at"`
	LastSeen  time.Time  `json:"last_seen"`
	StoppedAt *time.Time `json:"stopped_at,omitempty"`
	// State is "live" (seen within the last 15 seconds, three heartbeats),
	// "stale" (not seen since: crashed, frozen or cut off from the
	// database) or "stopped". Set by [Store.Workers]; a heartbeat ignores
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
