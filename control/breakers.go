package control

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// BreakerState is the published state of one circuit breaker of one
// worker process (table inboxmq_breakers).
type BreakerState struct {
	// Namespace is the inbox namespace of the route the breaker guards.
	Namespace string `json:"namespace"`
	// Downstream names what the breaker protects.
	Downstream string `json:"downstream"`
	// Worker is the worker process (its Config.Name).
	Worker string `json:"worker"`
	// State is "closed", "half-open" or "open".
	State string `json:"state"`
	// ChangedAt is when the worker entered State.
	ChangedAt time.Time `json:"changed_at"`
}

// Breakers returns the published breaker states, of namespace only
// when it is not empty, ordered by namespace, downstream and worker.
func (s *Store) Breakers(ctx context.Context, namespace string) ([]BreakerState, error) {
	rows, err := s.db.Query(ctx, `SELECT consumer, downstream, worker, state, changed_at FROM inboxmq_breakers
		WHERE $1 = '' OR consumer = $1 ORDER BY consumer, downstream, worker`, namespace)
	if err != nil {
		return nil, fmt.Errorf("control: list breakers: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BreakerState, error) {
		var b BreakerState
		err := r.Scan(&b.Namespace, &b.Downstream, &b.Worker, &b.State, &b.ChangedAt)
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("control: list breakers: %w", err)
	}
	return out, nil
}
