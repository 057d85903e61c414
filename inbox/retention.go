package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/inboxmq/inboxmq/internal/startstop"
)

// DefaultRetentionWindow is how long completed inbox rows are kept when
// RetentionConfig.Window is zero: the dedup window. A copy of a message
// that arrives after its row was deleted is processed again, so the window
// must exceed every way a message can come back (see [CheckWindow]).
const DefaultRetentionWindow = 7 * 24 * time.Hour

// ErrWindowTooShort is returned by [CheckWindow] (and so by [NewRetention])
// when the retention window is shorter than the redelivery horizon.
var ErrWindowTooShort = errors.New("inbox: retention window shorter than the redelivery horizon")

// RedeliveryHorizon is the longest time after its first delivery that a
// copy of a message can still arrive through inboxmq's own paths:
// attempts broker retries of at most maxRetryDelay each, plus the time an
// operator may take to replay it from the DLQ (replayWindow). Producer-side
// redelivery (an outbox relay re-publishing after a crash) is usually
// seconds and is covered by a window of days.
func RedeliveryHorizon(maxRetryDelay time.Duration, attempts int, replayWindow time.Duration) time.Duration {
	return maxRetryDelay*time.Duration(max(attempts, 0)) + replayWindow
}

// CheckWindow refuses a retention window shorter than horizon (see
// [RedeliveryHorizon]): deleting a completed row while a copy of its
// message may still arrive would let that copy run the effect twice. A
// zero or negative horizon is not checked. Run it at start-up.
func CheckWindow(window, horizon time.Duration) error {
	if window <= 0 {
		return fmt.Errorf("inbox: retention window %s must be positive", window)
	}
	if horizon > 0 && window < horizon {
		return fmt.Errorf("%w: window %s < horizon %s (max retry delay × attempts + DLQ replay window)",
			ErrWindowTooShort, window, horizon)
	}
	return nil
}

// RetentionConfig configures a [Retention] job. A nil *RetentionConfig means
// the defaults.
type RetentionConfig struct {
	// Window is how long completed rows are kept after completed_at (the
	// dedup window). Defaults to DefaultRetentionWindow (7 days).
	Window time.Duration
	// RedeliveryHorizon, when positive, makes NewRetention refuse a Window
	// shorter than it ([CheckWindow]). Defaults to 0: not checked.
	RedeliveryHorizon time.Duration
	// BatchSize is the most rows one DELETE removes, or on a partitioned
	// table the most rows one statement moves out of an expired partition
	// (one short transaction each, whose cost is bounded by BatchSize
	// whatever the number of rows). Defaults to 1000.
	BatchSize int
	// BatchDelay is the pause between two batches, which leaves room to the
	// inserting workers. Defaults to 10ms; -1 means no pause.
	BatchDelay time.Duration
	// MaxBatches bounds the batches of one run. Defaults to 0: run until no
	// expired row is left. On a partitioned table, an expired partition
	// whose rows to keep are not all moved when the batches run out waits
	// for the next run.
	MaxBatches int
	// Interval is the period between runs of a started job. Defaults to 5
	// minutes.
	Interval time.Duration
	// Logger logs each run that deleted rows. Defaults to the store's
	// logger.
	Logger *slog.Logger
}

// RetentionRun reports one retention run.
type RetentionRun struct {
	// Deleted is the number of rows deleted; on a partitioned table, the
	// planner's estimate of the rows of the dropped partitions.
	Deleted int64
	// Batches is the number of DELETE statements run, or on a partitioned
	// table the number of statements that moved rows to keep (Moved).
	Batches int
	// Partitions is the number of partitions dropped (partitioned table).
	Partitions int
	// Moved is the number of rows moved out of expired partitions to the
	// current one before these were dropped: rows not completed, or
	// completed after the cut-off (partitioned table).
	Moved int64
	// Kept is the number of expired partitions not dropped because a worker
	// was touching one of their keepers, or because the run's MaxBatches
	// ran out before all were moved; the next run drops them (partitioned
	// table).
	Kept int
	// Skipped is true when another process held the retention lock, so
	// this run did nothing.
	Skipped bool
}

// Retention deletes completed inbox rows older than the window, in small
// batches, in the background. On a partitioned inbox
// (migrations.PartitionInbox) it deletes no row: each run creates the
// partitions ahead and drops the partitions whose whole span is older than
// the window, after moving the rows it must keep (not completed, or
// completed within the window) to the current partition; a completed row
// then lives between Window and Window plus the partition width
// (docs/scaling.md). Only one process runs it at a time per inbox
// table: each run holds a PostgreSQL advisory lock (keyed by the table's
// oid) for its duration and skips when another process holds it, so every
// worker may start the job.
//
// Each batch deletes the oldest expired rows in one short statement that
// uses an index (no full scan, no long lock), and rows that workers are
// touching are skipped rather than waited for (see docs/internals.md).
type Retention struct {
	store *Store
	cfg   RetentionConfig
	lock  string
	del   string

	svc startstop.Service // the background job's lifecycle
}

// NewRetention returns a retention job for s's table. It refuses a window
// shorter than cfg.RedeliveryHorizon.
func NewRetention(s *Store, cfg *RetentionConfig) (*Retention, error) {
	if s == nil {
		return nil, errors.New("inbox: nil store")
	}
	var c RetentionConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Window == 0 {
		c.Window = DefaultRetentionWindow
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 1000
	}
	if c.BatchDelay == 0 {
		c.BatchDelay = 10 * time.Millisecond
	}
	if c.Interval <= 0 {
		c.Interval = 5 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = s.cfg.Logger
	}
	if err := CheckWindow(c.Window, c.RedeliveryHorizon); err != nil {
		return nil, err
	}
	return &Retention{
		store: s,
		cfg:   c,
		svc:   startstop.Service{Name: "inbox: retention"},
		// One lock per table: the high half names the job, the low half is
		// the table's oid.
		lock: `(hashtext('inboxmq_retention')::bigint << 32) | to_regclass($1)::oid::bigint`,
		del: `DELETE FROM ` + s.table + ` WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM ` + s.table + `
	WHERE status = 'completed' AND completed_at < $1
	ORDER BY completed_at LIMIT $2
	FOR UPDATE SKIP LOCKED))`,
	}, nil
}

// Window returns the configured retention window.
func (r *Retention) Window() time.Duration { return r.cfg.Window }

// RunOnce deletes the rows completed before now − Window, batch by batch,
// if no other process is running retention on this table (else it returns
// a run with Skipped set).
func (r *Retention) RunOnce(ctx context.Context) (RetentionRun, error) {
	return r.purge(ctx, time.Now().Add(-r.cfg.Window))
}

// PurgeBefore is RunOnce with an explicit cut-off: it deletes the rows
// completed before cutoff (inboxctl purge --older-than). It does not apply
// the window check: the caller chose the cut-off. On a partitioned table it
// drops the partitions that ended before cutoff: rows of the partition
// holding cutoff stay.
func (r *Retention) PurgeBefore(ctx context.Context, cutoff time.Time) (RetentionRun, error) {
	return r.purge(ctx, cutoff)
}

func (r *Retention) purge(ctx context.Context, cutoff time.Time) (RetentionRun, error) {
	var run RetentionRun
	if err := r.store.ready(); err != nil {
		return run, err
	}
	conn, err := r.store.pool.Acquire(ctx)
	if err != nil {
		return run, fmt.Errorf("inbox: retention: acquire: %w", err)
	}
	defer conn.Release()

	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+r.lock+`)`, r.store.table).Scan(&got); err != nil {
		return run, fmt.Errorf("inbox: retention: lock: %w", err)
	}
	if !got {
		run.Skipped = true
		return run, nil
	}
	defer func() {
		// Unlock even if ctx ended; a broken connection drops the lock anyway.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, `SELECT pg_advisory_unlock(`+r.lock+`)`, r.store.table); err != nil {
			_ = conn.Conn().Close(uctx) // the session, and with it the lock, is gone
		}
	}()

	if r.store.part != nil {
		return r.dropPartitions(ctx, conn, cutoff)
	}
	for r.cfg.MaxBatches <= 0 || run.Batches < r.cfg.MaxBatches {
		tag, err := conn.Exec(ctx, r.del, cutoff, r.cfg.BatchSize)
		if err != nil {
			return run, fmt.Errorf("inbox: retention: delete: %w", err)
		}
		run.Batches++
		run.Deleted += tag.RowsAffected()
		if tag.RowsAffected() < int64(r.cfg.BatchSize) {
			break
		}
		if err := r.pause(ctx); err != nil {
			return run, err
		}
	}
	if run.Deleted > 0 {
		r.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "inbox: retention deleted completed rows",
			slog.Int64("deleted", run.Deleted), slog.Int("batches", run.Batches), slog.Time("cutoff", cutoff))
	}
	return run, nil
}

// pause waits BatchDelay between two batches, or returns ctx's error.
func (r *Retention) pause(ctx context.Context) error {
	if r.cfg.BatchDelay <= 0 {
		return nil
	}
	t := time.NewTimer(r.cfg.BatchDelay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Start runs the job in the background every Interval (the first run at
// once) until [Retention.Stop]; ctx's cancellation does not stop it. Errors
// of a run are logged and the next run tries again. A Start while the job
// runs returns an error.
func (r *Retention) Start(ctx context.Context) error {
	return r.svc.Start(ctx, nil, r.loop)
}

// Stop ends the job, interrupting a run between batches, and waits for it,
// bounded by ctx (if ctx ends first, it returns an error joined with
// ctx.Err() and the job ends in the background). It is idempotent and safe
// without Start.
func (r *Retention) Stop(ctx context.Context) error { return r.svc.Stop(ctx) }

// Stopped returns a channel closed when the job started by the last Start
// has ended (closed before any Start).
func (r *Retention) Stopped() <-chan struct{} { return r.svc.Stopped() }

func (r *Retention) loop(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := r.RunOnce(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "inbox: retention run failed", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
