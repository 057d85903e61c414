package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxmq/inboxmq/migrations"
)

// Retention of a partitioned inbox (migrations.PartitionInbox): whole
// partitions are dropped, no row is deleted. docs/scaling.md gives the
// argument; in short, a partition whose span ended before the cut-off holds
// rows completed before the cut-off, except the keepers (a row not
// completed, or completed after the cut-off: a key claimed long ago and
// completed, failed or dead since). The keepers are moved to the current
// bucket first, each under its key's advisory lock (the one the bucket
// function takes), in batches of RetentionConfig.BatchSize, each a
// transaction of its own: dead and failed rows pile up (every expiry
// carries them forward), and the locks, so the cost of a transaction, stay
// bounded whatever their number. Then the partition is detached
// concurrently (workers keep going) and dropped. No statement of the inbox
// turns a completed row back into a keeper, and no insert targets an
// expired bucket, so a partition without keepers stays without keepers
// until it is dropped.

// partitionStatements are retention's statements on a partitioned table.
type partitionStatements struct {
	list, moveKeepers, hasKeepers string
}

func buildPartitionStatements(p *migrations.Partitioning) partitionStatements {
	keeper := `bucket >= $1 AND bucket < $2 AND (status <> 'completed' OR (status = 'completed' AND completed_at >= $3))`
	return partitionStatements{
		// The partitions with their bounds, oldest first.
		list: `SELECT c.oid::regclass::text, m[1]::timestamptz, m[2]::timestamptz, i.inhdetachpending
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid,
	LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\) TO \(''([^'']+)''\)') m
WHERE i.inhparent = to_regclass($1)
ORDER BY 2`,
		// One batch: at most $4 keepers of the partition [$1, $2), locked
		// (SKIP LOCKED) and materialised first, so that the key's advisory
		// lock is tried on those rows only (at most $4 locks in the
		// transaction), then moved by their ctid (the bucket bounds prune
		// the update to this one partition). SKIP LOCKED and the try-lock
		// leave the rows that a worker is touching: they stay keepers, and
		// the partition waits for the next run.
		moveKeepers: `WITH k AS MATERIALIZED (
	SELECT ctid, consumer, key FROM ` + p.Table + ` WHERE ` + keeper + `
	LIMIT $4 FOR UPDATE SKIP LOCKED)
UPDATE ` + p.Table + ` AS t SET bucket = DEFAULT, updated_at = now()
WHERE t.bucket >= $1 AND t.bucket < $2
	AND t.ctid = ANY(ARRAY(SELECT k.ctid FROM k WHERE pg_try_advisory_xact_lock(hashtext(k.consumer), hashtext(k.key))))`,
		hasKeepers: `SELECT EXISTS (SELECT 1 FROM ` + p.Table + ` WHERE ` + keeper + `)`,
	}
}

// moveKeepers moves the keepers of the expired partition pi to the current
// bucket, in batches of BatchSize (each a statement and a transaction of
// its own), until a batch moves fewer (the rest, if any, a worker is
// touching) or the run's MaxBatches are spent.
func (r *Retention) moveKeepers(ctx context.Context, conn *pgxpool.Conn, ps *partitionStatements, pi partitionInfo, cutoff time.Time, run *RetentionRun) error {
	for r.cfg.MaxBatches <= 0 || run.Batches < r.cfg.MaxBatches {
		tag, err := conn.Exec(ctx, ps.moveKeepers, pi.lo, pi.hi, cutoff, r.cfg.BatchSize)
		if err != nil {
			return fmt.Errorf("inbox: retention: move keepers of %s: %w", pi.name, err)
		}
		run.Batches++
		run.Moved += tag.RowsAffected()
		if tag.RowsAffected() < int64(r.cfg.BatchSize) {
			return nil
		}
		if err := r.pause(ctx); err != nil {
			return err
		}
	}
	return nil
}

type partitionInfo struct {
	name    string
	lo, hi  time.Time
	pending bool
}

// dropPartitions is purge on a partitioned table: it creates the
// partitions ahead, then drops each partition that ended before cutoff and
// before the current bucket (the one keepers move to), holding the
// retention lock on conn.
func (r *Retention) dropPartitions(ctx context.Context, conn *pgxpool.Conn, cutoff time.Time) (RetentionRun, error) {
	var run RetentionRun
	p := r.store.part
	ps := buildPartitionStatements(p)
	if err := migrations.CreatePartitions(ctx, r.store.pool, p, time.Now()); err != nil {
		return run, fmt.Errorf("inbox: retention: %w", err)
	}
	// The database's clock sets the bucket the keepers move to (the
	// column's default): only a partition that ended before it is left by
	// its keepers, and a later transaction's now() is not earlier.
	var now time.Time
	if err := conn.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return run, fmt.Errorf("inbox: retention: %w", err)
	}
	current := p.Bucket(now)
	rows, err := conn.Query(ctx, ps.list, p.Table)
	if err != nil {
		return run, fmt.Errorf("inbox: retention: list partitions: %w", err)
	}
	parts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (partitionInfo, error) {
		var pi partitionInfo
		err := row.Scan(&pi.name, &pi.lo, &pi.hi, &pi.pending)
		return pi, err
	})
	if err != nil {
		return run, fmt.Errorf("inbox: retention: list partitions: %w", err)
	}
	for _, pi := range parts {
		if pi.hi.After(cutoff) || pi.hi.After(current) {
			break
		}
		if !pi.pending {
			if err := r.moveKeepers(ctx, conn, &ps, pi, cutoff, &run); err != nil {
				return run, err
			}
			var kept bool
			if err := conn.QueryRow(ctx, ps.hasKeepers, pi.lo, pi.hi, cutoff).Scan(&kept); err != nil {
				return run, fmt.Errorf("inbox: retention: keepers of %s: %w", pi.name, err)
			}
			if kept {
				run.Kept++
				continue
			}
		}
		var est int64
		if err := conn.QueryRow(ctx, `SELECT GREATEST(reltuples, 0)::bigint FROM pg_class WHERE oid = to_regclass($1)`,
			pi.name).Scan(&est); err != nil {
			return run, fmt.Errorf("inbox: retention: size of %s: %w", pi.name, err)
		}
		// CONCURRENTLY takes the inbox table in SHARE UPDATE EXCLUSIVE mode
		// only; an interrupted detach leaves the partition pending, and the
		// next run finalizes it.
		detach := `ALTER TABLE ` + p.Table + ` DETACH PARTITION ` + pi.name + ` CONCURRENTLY`
		if pi.pending {
			detach = `ALTER TABLE ` + p.Table + ` DETACH PARTITION ` + pi.name + ` FINALIZE`
		}
		if _, err := conn.Exec(ctx, detach); err != nil {
			return run, fmt.Errorf("inbox: retention: detach %s: %w", pi.name, err)
		}
		if _, err := conn.Exec(ctx, `DROP TABLE `+pi.name); err != nil {
			return run, fmt.Errorf("inbox: retention: drop %s: %w", pi.name, err)
		}
		run.Partitions++
		run.Deleted += est
	}
	if run.Partitions > 0 || run.Kept > 0 {
		r.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "inbox: retention dropped expired partitions",
			slog.Int("partitions", run.Partitions), slog.Int64("rows_estimate", run.Deleted),
			slog.Int64("moved", run.Moved), slog.Int("batches", run.Batches), slog.Int("kept", run.Kept), slog.Time("cutoff", cutoff))
	}
	return run, nil
}

// Partitions that ran out. There is no default partition: once the
// partitions ahead are used up (no retention job, a failing one, or one
// whose role may not create them), every insert into the inbox fails with
// "no partition of relation … found for row". MapError makes that a retry
// (db_no_partition), never a dead letter; the store then creates the
// missing partitions itself, so that the retry finds them. One creation
// runs at a time per store, and after one, the next is tried no sooner
// than healInterval (a failed one: healRetryAfter) later: the deliveries
// that meet the error meanwhile return their retry at once, and the log
// gets one line per creation, not one per delivery.

const (
	msgPartitionsCreated = "inbox: the partitioned inbox table had no partition for the current time; " +
		"created the partitions ahead. The retention job creates them on every run: check that it runs"
	msgPartitionsNotCreated = "inbox: the partitioned inbox table has no partition for the current time, " +
		"and creating it failed: every delivery is retried until it exists"
	fixPartitions = "run `inboxctl partition` (migrations.PartitionInbox) as the inbox table's owner now; " +
		"then run the retention job (inboxmq.Config.RetentionWindow, on by default) under a role that owns the inbox table and may CREATE in its schema: " +
		"it creates the partitions ahead on every run"
	// healTimeout bounds one creation (it may wait for retention's).
	healTimeout = 30 * time.Second
	// healRetryAfter is the pause after a failed creation.
	healRetryAfter = time.Minute
)

// partitionHealer is the store's guard on partition creation.
type partitionHealer struct {
	busy sync.Mutex   // held by the creation under way (TryLock only)
	next atomic.Int64 // Unix nanoseconds before which no creation starts
}

// healInterval is the shortest time between two creations: the partitions
// one creates last at least one width.
func healInterval(p *migrations.Partitioning) time.Duration { return min(p.Width, time.Minute) }

// healPartitions creates the missing partitions of the inbox table if err
// (a delivery's verdict) is an insert that found none, unless a creation
// is under way or ran less than healInterval ago. It runs on the
// delivery's goroutine, before the delivery returns its retry, so that an
// in-process retry finds the partitions.
func (s *Store) healPartitions(ctx context.Context, err error) {
	if s.part == nil || err == nil || !s.noInboxPartition(err) {
		return
	}
	h := &s.heal
	if time.Now().UnixNano() < h.next.Load() || !h.busy.TryLock() {
		return
	}
	defer h.busy.Unlock()
	if time.Now().UnixNano() < h.next.Load() {
		return // a creation ended between the check and the lock
	}
	cctx, cancel := context.WithTimeout(ctx, healTimeout)
	defer cancel()
	cerr := migrations.CreatePartitions(cctx, s.pool, s.part, time.Now())
	if cerr != nil && ctx.Err() != nil {
		return // the delivery ended (a stop): the next one tries again
	}
	attrs := []slog.Attr{
		slog.String("table", s.part.Table), slog.Duration("width", s.part.Width), slog.Int("ahead", s.part.Ahead),
	}
	if cerr != nil {
		h.next.Store(time.Now().Add(healRetryAfter).UnixNano())
		s.cfg.Logger.LogAttrs(ctx, slog.LevelError, msgPartitionsNotCreated,
			append(attrs, slog.Any("error", cerr), slog.String("fix", fixPartitions))...)
		return
	}
	h.next.Store(time.Now().Add(healInterval(s.part)).UnixNano())
	s.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, msgPartitionsCreated, attrs...)
}

// noInboxPartition reports whether err is an insert into the store's
// inbox table that found no partition for its row (a handler's own
// partitioned table is not the store's to heal).
func (s *Store) noInboxPartition(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && noPartition(pgErr) &&
		pgx.Identifier{pgErr.SchemaName, pgErr.TableName}.Sanitize() == s.part.Table
}
