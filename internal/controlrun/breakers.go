package controlrun

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/startstop"
)

const upsertBreaker = `
INSERT INTO inboxmq_breakers (consumer, downstream, worker, state, changed_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (consumer, downstream, worker) DO UPDATE SET state = excluded.state, changed_at = excluded.changed_at`

// setBreaker records b (a worker's breaker entering b.State) through db.
func setBreaker(ctx context.Context, db control.DB, b control.BreakerState) error {
	if !consumer.ValidName(b.Namespace) {
		return fmt.Errorf("%w: namespace %q", control.ErrInvalid, b.Namespace)
	}
	if b.ChangedAt.IsZero() {
		b.ChangedAt = time.Now()
	}
	if _, err := db.Exec(ctx, upsertBreaker, b.Namespace, b.Downstream, b.Worker, b.State, b.ChangedAt); err != nil {
		return fmt.Errorf("controlrun: set breaker %s/%s: %w", b.Namespace, b.Downstream, err)
	}
	return nil
}

// clearBreakers deletes the breaker rows of worker (a worker that stops).
func clearBreakers(ctx context.Context, db control.DB, worker string) error {
	if _, err := db.Exec(ctx, `DELETE FROM inboxmq_breakers WHERE worker = $1`, worker); err != nil {
		return fmt.Errorf("controlrun: clear breakers of %s: %w", worker, err)
	}
	return nil
}

// BreakerReporter publishes a worker's breaker states to PostgreSQL off
// the delivery path: [BreakerReporter.Report] only records the latest
// state of each breaker, and a background loop writes what changed. A
// state that a newer one replaced before it was written is skipped. Start
// writes nothing; Stop writes what is pending and then deletes the
// worker's rows, since a stopped worker's breakers hold nothing back.
type BreakerReporter struct {
	db     control.DB
	worker string
	logger *slog.Logger

	mu      sync.Mutex
	pending map[[2]string]control.BreakerState
	wake    chan struct{}

	svc startstop.Service
}

// NewBreakerReporter returns a reporter writing through db for worker (a
// nil logger discards its lines).
func NewBreakerReporter(db control.DB, worker string, logger *slog.Logger) *BreakerReporter {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &BreakerReporter{
		db: db, worker: worker, logger: logger,
		pending: make(map[[2]string]control.BreakerState), wake: make(chan struct{}, 1),
		svc: startstop.Service{Name: "controlrun: breaker reporter"},
	}
}

// Report records that the breaker of namespace on downstream entered
// state. It never blocks on the database.
func (r *BreakerReporter) Report(namespace, downstream, state string) {
	r.mu.Lock()
	r.pending[[2]string{namespace, downstream}] = control.BreakerState{
		Namespace: namespace, Downstream: downstream, Worker: r.worker, State: state, ChangedAt: time.Now(),
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
	if cerr := clearBreakers(ctx, r.db, r.worker); cerr != nil {
		r.logger.LogAttrs(ctx, slog.LevelWarn, "controlrun: clearing breaker states failed", slog.Any("error", cerr))
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
	r.pending = make(map[[2]string]control.BreakerState)
	r.mu.Unlock()
	for k, b := range batch {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := setBreaker(wctx, r.db, b)
		cancel()
		if err != nil {
			r.logger.LogAttrs(ctx, slog.LevelWarn, "controlrun: publishing a breaker state failed",
				slog.String("namespace", b.Namespace), slog.String("downstream", b.Downstream), slog.Any("error", err))
			r.mu.Lock()
			if _, newer := r.pending[k]; !newer {
				r.pending[k] = b
			}
			r.mu.Unlock()
		}
	}
}
