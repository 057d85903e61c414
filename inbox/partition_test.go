package inbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/migrations"
	"github.com/inboxmq/inboxmq/retry"
)

// unpartitioned returns a fresh schema whose inbox table is not partitioned
// yet (these tests partition it themselves, after seeding it).
func unpartitioned(t *testing.T) *pgxpool.Pool {
	t.Helper()
	if pgtest.Partitioned() {
		t.Skip("partitions its own table: runs in the default test run")
	}
	pool, _ := pgtest.Schema(t)
	return pool
}

// skipPartitioned skips a test of row-by-row retention on a partitioned
// table (INBOXMQ_TEST_PARTITIONED=1), where retention drops partitions
// instead: TestPartitionedRetention_* cover it.
func skipPartitioned(t *testing.T) {
	t.Helper()
	if pgtest.Partitioned() {
		t.Skip("row-by-row retention: the partitioned table drops partitions instead")
	}
}

func partition(t *testing.T, pool *pgxpool.Pool) *migrations.Partitioning {
	t.Helper()
	p, err := migrations.PartitionInbox(t.Context(), pool, &migrations.PartitionConfig{Width: time.Hour, Ahead: 2})
	require.NoError(t, err)
	return p
}

func partitionCount(t *testing.T, pool *pgxpool.Pool, where string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid,
		LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\)') m
		WHERE i.inhparent = 'inboxmq_inbox'::regclass AND `+where).Scan(&n))
	return n
}

func TestPartitionInbox_MigratesRowsAndDedupsAcrossPartitions(t *testing.T) {
	t.Parallel()
	pool := unpartitioned(t)
	// A key completed 5 hours ago, and one that failed 5 hours ago.
	_, err := pool.Exec(t.Context(), `INSERT INTO inboxmq_inbox (consumer, key, status, completed_at, first_seen_at) VALUES
		('payments', 'order:old', 'completed', now() - interval '5 hours', now() - interval '5 hours'),
		('payments', 'order:failed', 'failed', NULL, now() - interval '5 hours')`)
	require.NoError(t, err)

	p := partition(t, pool)
	require.Equal(t, time.Hour, p.Width)
	// From the completed row's hour to 2 hours ahead.
	require.GreaterOrEqual(t, partitionCount(t, pool, `true`), 8)
	require.Equal(t, 2, partitionCount(t, pool, `m[1]::timestamptz > now()`))
	var oldBucket, failedBucket time.Time
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT
		(SELECT bucket FROM inboxmq_inbox WHERE key = 'order:old'),
		(SELECT bucket FROM inboxmq_inbox WHERE key = 'order:failed')`).Scan(&oldBucket, &failedBucket))
	require.Less(t, time.Since(oldBucket), 7*time.Hour)
	require.Greater(t, time.Since(oldBucket), 4*time.Hour)
	require.Less(t, time.Since(failedBucket), time.Hour+time.Minute)
	// The old table stays for the operator.
	var kept bool
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT to_regclass('inboxmq_inbox_unpartitioned') IS NOT NULL`).Scan(&kept))
	require.True(t, kept)

	b := setupOn(t, pool, nil)
	require.True(t, b.store.Partitioned())
	var calls atomic.Int64
	h := inbox.Handler(b.store, effectHandler(&calls), nil)
	// The copy of a key whose row is in a partition hours old is a duplicate.
	err = h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "old", Amount: 1}, false))
	require.ErrorIs(t, err, retry.ErrDuplicate)
	require.Zero(t, calls.Load())
	// The failed key is taken up again in its own partition: still one row.
	require.NoError(t, h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "failed", Amount: 1}, false)))
	require.NoError(t, h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "new", Amount: 1}, false)))
	require.Equal(t, int64(2), calls.Load())
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE key = 'order:failed'`))
	require.Equal(t, inbox.RecordCompleted, b.get(t, "payments", "order:failed").Status)
	// Running it again only tops up the partitions ahead.
	_, err = migrations.PartitionInbox(t.Context(), pool, &migrations.PartitionConfig{Width: time.Hour})
	require.NoError(t, err)
}

// TestPartitionInbox_ClaimsSerialiseAcrossTheBoundary is the race at a
// bucket boundary: copy A of a key is claimed (not committed) in the
// previous bucket; copy B comes after the rollover. Without the bucket
// function's advisory lock B would not see A's uncommitted row, would
// insert into the current partition without a conflict and run the effect
// a second time; with it, B waits for A and then finds A's row.
func TestPartitionInbox_ClaimsSerialiseAcrossTheBoundary(t *testing.T) {
	t.Parallel()
	pool := unpartitioned(t)
	p := partition(t, pool)
	b := setupOn(t, pool, nil)

	// Copy A: what a claimer whose transaction started before the rollover
	// does (the bucket function, then the insert into its bucket), left
	// uncommitted.
	txA, err := pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = txA.Rollback(context.Background()) }()
	prev := p.Bucket(time.Now()).Add(-p.Width)
	require.NoError(t, migrations.CreatePartitions(t.Context(), pool, p, prev))
	_, err = txA.Exec(t.Context(), `SELECT `+p.Func+`('payments', 'order:edge')`)
	require.NoError(t, err)
	_, err = txA.Exec(t.Context(), `INSERT INTO inboxmq_inbox (consumer, key, status, fence, completed_at, bucket)
		VALUES ('payments', 'order:edge', 'completed', 1, now(), $1)`, prev)
	require.NoError(t, err)
	_, err = txA.Exec(t.Context(), `INSERT INTO effects (key, amount) VALUES ('order:edge', 1)`)
	require.NoError(t, err)

	// Copy B, through the store, in the current bucket.
	var calls atomic.Int64
	h := inbox.Handler(b.store, effectHandler(&calls), nil)
	done := make(chan error, 1)
	go func() {
		done <- h.Handle(context.Background(), newMsg(t, "payments", order{OrderID: "edge", Amount: 1}, false))
	}()

	// B waits on the key's advisory lock (a signal, not a sleep).
	testenv.WaitFor(t, "copy B waiting on the key's lock", func() bool {
		select {
		case err := <-done:
			t.Fatalf("copy B did not wait for copy A (err %v, effects run %d)", err, calls.Load())
		default:
		}
		var n int
		_ = pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n)
		return n > 0
	})
	require.NoError(t, txA.Commit(t.Context()))

	err = testenv.WaitChan(t, done, "copy B")
	require.ErrorIs(t, err, retry.ErrDuplicate)
	require.Zero(t, calls.Load())
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE key = 'order:edge'`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:edge'`))
}

func TestPartitionedRetention_DropsExpiredPartitionsAndMovesKeepers(t *testing.T) {
	t.Parallel()
	pool := unpartitioned(t)
	seedCompleted(t, pool, "old", 50, 30*time.Hour)
	seedCompleted(t, pool, "young", 20, time.Hour)
	p := partition(t, pool)
	old := p.Bucket(time.Now().Add(-30 * time.Hour))
	// Keepers in the expired partition: a key that failed, a claim, and a
	// key completed within the window (claimed long ago).
	_, err := pool.Exec(t.Context(), `INSERT INTO inboxmq_inbox (consumer, key, status, owner, lease_until, completed_at, bucket) VALUES
		('old', 'failed:1', 'failed', NULL, NULL, NULL, $1),
		('old', 'claim:1', 'processing', 'w1', now() - interval '1 hour', NULL, $1),
		('old', 'late:1', 'completed', NULL, NULL, now() - interval '2 hours', $1)`, old)
	require.NoError(t, err)
	// A key touched by a worker now (its advisory lock held) keeps the
	// partition for the next run.
	busy, err := pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = busy.Rollback(context.Background()) }()
	_, err = busy.Exec(t.Context(), `SELECT pg_advisory_xact_lock(hashtext('old'), hashtext('late:1'))`)
	require.NoError(t, err)

	s, err := inbox.NewStore(pool, nil)

	if err == nil {

		err = s.Check(t.Context())

	}
	require.NoError(t, err)
	r, err := inbox.NewRetention(s, &inbox.RetentionConfig{Window: 24 * time.Hour})
	require.NoError(t, err)
	run, err := r.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(2), run.Moved)
	require.Equal(t, 1, run.Kept)
	oldPart := `m[1]::timestamptz = '` + old.Format(time.RFC3339) + `'`
	require.Equal(t, 1, partitionCount(t, pool, oldPart))

	require.NoError(t, busy.Rollback(t.Context()))
	run, err = r.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(1), run.Moved)
	require.Equal(t, 1, run.Partitions)
	require.Zero(t, run.Kept)
	require.Zero(t, partitionCount(t, pool, oldPart))

	require.Zero(t, countRows(t, pool, `consumer = 'old' AND key LIKE 'old:%'`))
	require.Equal(t, 20, countRows(t, pool, `consumer = 'young'`))
	require.Equal(t, 3, countRows(t, pool, `key IN ('failed:1', 'claim:1', 'late:1')`))
	require.Equal(t, 0, partitionCount(t, pool, `m[1]::timestamptz < now() - interval '25 hours'`))
	require.Equal(t, 2, partitionCount(t, pool, `m[1]::timestamptz > now()`))
	// No DELETE ran: the rows went with their partition. The statements
	// counted are the moves, one per expired partition (fewer keepers
	// than BatchSize each).
	require.Equal(t, run.Partitions, run.Batches)

	// The moved keepers are still the keys' one row: a claim finds them.
	b := setupOn(t, pool, nil)
	err = inbox.Handler(b.store, effectHandler(nil), nil).Handle(t.Context(), newMsg(t, "old", order{OrderID: "x"}, false))
	require.NoError(t, err)
	r2, err := b.store.Get(t.Context(), "old", "late:1")
	require.NoError(t, err)
	require.Equal(t, inbox.RecordCompleted, r2.Status)
}

// BatchSize bounds the keepers one statement moves (one transaction each),
// and MaxBatches the statements of a run: an expired partition whose
// keepers are not all moved when the run's batches are spent waits for the
// next run, which moves the rest and drops it.
func TestPartitionedRetention_MovesKeepersInBatches(t *testing.T) {
	t.Parallel()
	pool := unpartitioned(t)
	p := partition(t, pool)
	old := p.Bucket(time.Now().Add(-30 * time.Hour))
	require.NoError(t, migrations.CreatePartitions(t.Context(), pool, p, old))
	_, err := pool.Exec(t.Context(), `INSERT INTO inboxmq_inbox (consumer, key, status, bucket)
		SELECT 'old', 'dead:' || g, 'dead', $1 FROM generate_series(1, 5) g`, old)
	require.NoError(t, err)
	oldPart := `m[1]::timestamptz = '` + old.Format(time.RFC3339) + `'`
	s, err := inbox.NewStore(pool, nil)
	if err == nil {
		err = s.Check(t.Context())
	}
	require.NoError(t, err)

	r, err := inbox.NewRetention(s, &inbox.RetentionConfig{Window: 24 * time.Hour, BatchSize: 2, BatchDelay: -1, MaxBatches: 2})
	require.NoError(t, err)
	run, err := r.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(4), run.Moved)
	require.Equal(t, 2, run.Batches)
	require.Equal(t, 1, run.Kept)
	require.Equal(t, 1, partitionCount(t, pool, oldPart))
	require.Equal(t, 1, countRows(t, pool, `bucket = $1`, old))

	r, err = inbox.NewRetention(s, &inbox.RetentionConfig{Window: 24 * time.Hour, BatchSize: 2, BatchDelay: -1})
	require.NoError(t, err)
	run, err = r.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(1), run.Moved)
	require.Zero(t, run.Kept)
	require.Zero(t, partitionCount(t, pool, oldPart))
	require.Equal(t, 5, countRows(t, pool, `key LIKE 'dead:%' AND status = 'dead'`))
}
