package control

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxmq/inboxmq/internal/startstop"
)

// BreakerState is the published state of one circuit breaker of one
// worker process (table inboxmq_breakers).
type BreakerState struct {
	// Consumer is the inbox namespace of the route the breaker guards.
	Consumer string `json:"consumer"`
	// Downstream names what the breaker protects.
	Downstream string `json:"downstream"`
	// Worker is the worker process (its Config.Name).
	Worker string `json:"worker"`
	// State is "closed", "half-open" or "open".
	State string `json:"state"`
	// ChangedAt is when the worker entered State.
	ChangedAt time.Time `json:"changed_at"`
}

const upsertBreaker = `
INSERT INTO inboxmq_breakers (consumer, downstream, worker, state, changed_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (consumer, downstream, worker) DO UPDATE SET state = excluded.state, changed_at = excluded.changed_at`

// SetBreaker records b (a worker's breaker entering b.State).
func (s *Store) SetBreaker(ctx context.Context, b BreakerState) error {
	if err := checkConsumer(b.Consumer); err != nil {
		return err
	}
	if b.ChangedAt.IsZero() {
		b.ChangedAt = time.Now()
	}
	if _, err := s.db.Exec(ctx, upsertBreaker, b.Consumer, b.Downstream, b.Worker, b.State, b.ChangedAt); err != nil {
		return fmt.Errorf("control: set breaker %s/%s: %w", b.Consumer, b.Downstream, err)
	}
	return nil
}

// ClearBreakers deletes the breaker rows of worker (a worker that stops).
func (s *Store) ClearBreakers(ctx context.Context, worker string) error {
	if _, err := s.db.Exec(ctx, `DELETE FROM inboxmq_breakers WHERE worker = $1`, worker); err != nil {
		return fmt.Errorf("control: clear breakers of %s: %w", worker, err)
	}
	return nil
}

// Breakers returns the published breaker states, of consumerName only
// when it is not empty, ordered by consumer, downstream and worker.
func (s *Store) Breakers(ctx context.Context, consumerName string) ([]BreakerState, error) {
	rows, err := s.db.Query(ctx, `SELECT consumer, downstream, worker, state, changed_at FROM inboxmq_breakers
		WHERE $1 = '' OR consumer = $1 ORDER BY consumer, downstream, worker`, consumerName)
	if err != nil {
		return nil, fmt.Errorf("control: list breakers: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BreakerState, error) {
		var b BreakerState
		err := r.Scan(&b.Consumer, &b.Downstream, &b.Worker, &b.State, &b.ChangedAt)
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("control: list breakers: %w", err)
	}
	return out, nil
}

// BreakerReporter publishes a worker's breaker states to PostgreSQL off
// the delivery path: [BreakerReporter.Report] only records the latest
// state of each breaker, and a background loop writes what changed. A
// state that a newer one replaced before it was written is skipped. Start
// writes nothing; Stop writes what is pending and then deletes the
// worker's rows, since a stopped worker's breakers hold nothing back.
type BreakerReporter struct {
	store  *Store
	worker string
	logger *slog.Logger

	mu      sync.Mutex
	pending map[[2]string]BreakerState
	wake    chan struct{}

	svc startstop.Service
}

// NewBreakerReporter returns a reporter writing through db for worker (a
// nil logger discards its lines).
func NewBreakerReporter(db DB, worker string, logger *slog.Logger) *BreakerReporter {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &BreakerReporter{
		store: NewStore(db), worker: worker, logger: logger,
		pending: make(map[[2]string]BreakerState), wake: make(chan struct{}, 1),
		svc: startstop.Service{Name: "control: breaker reporter"},
	}
}

// Report records that the breaker of consumerName on downstream entered
// state. It never blocks on the database.
func (r *BreakerReporter) Report(consumerName, downstream, state string) {
	r.mu.Lock()
	r.pending[[2]string{consumerName, downstream}] = BreakerState{
		Consumer: consumerName, Downstream: downstream, Worker: r.worker, State: state, ChangedAt: time.Now(),
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Start starts the writing loop.
func (r *BreakerReporter) Start(ctx context.Context) error { return r.svc.Start(ctx, nil, r.run) }

// Stop ends the loop, writes what is pending and deletes the worker's
// rows, bounded by ctx.
func (r *BreakerReporter) Stop(ctx context.Context) error {
	err := r.svc.Stop(ctx)
	if cerr := r.store.ClearBreakers(ctx, r.worker); cerr != nil {
		r.logger.LogAttrs(ctx, slog.LevelWarn, "control: clearing breaker states failed", slog.Any("error", cerr))
	}
	return err
}

func (r *BreakerReporter) run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
		}
		r.flush(ctx)
	}
}

// flush writes the pending states; a failed write is kept for the next
// report (unless a newer state replaced it).
func (r *BreakerReporter) flush(ctx context.Context) {
	r.mu.Lock()
	batch := r.pending
	r.pending = make(map[[2]string]BreakerState)
	r.mu.Unlock()
	for k, b := range batch {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := r.store.SetBreaker(wctx, b)
		cancel()
		if err != nil {
			r.logger.LogAttrs(ctx, slog.LevelWarn, "control: publishing a breaker state failed",
				slog.String("consumer", b.Consumer), slog.String("downstream", b.Downstream), slog.Any("error", err))
			r.mu.Lock()
			if _, newer := r.pending[k]; !newer {
				r.pending[k] = b
			}
			r.mu.Unlock()
		}
	}
}
