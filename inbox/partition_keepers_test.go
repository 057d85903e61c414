package inbox_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/migrations"
)

// Dead and failed rows are keepers: every expiry carries them forward to
// the current partition, so they pile up. Retention must move any number
// of them at a bounded cost per transaction. Moved in one statement, with
// one advisory lock per row, 100,000 of them overflowed the lock table
// (SQLSTATE 53200, out of shared memory) on every pass, and no partition
// was dropped again. The test runs on a PostgreSQL server of its own with
// the stock lock table (max_locks_per_transaction 64) and few connections:
// the shared server's lock table is never put at risk.
func TestPartitionedRetention_MovesManyKeepersInBoundedTransactions(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv := pgtest.StartPrimary(t, "max_locks_per_transaction = 64", "max_connections = 20")
	pool, err := pgxpool.New(ctx, srv.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var locks string
	require.NoError(t, pool.QueryRow(ctx, `SHOW max_locks_per_transaction`).Scan(&locks))
	require.Equal(t, "64", locks)

	require.NoError(t, migrations.Up(ctx, pool))
	p, err := migrations.PartitionInbox(ctx, pool, &migrations.PartitionConfig{Width: time.Hour, Ahead: 1})
	require.NoError(t, err)
	old := p.Bucket(dbNow(t, pool).Add(-30 * time.Hour))
	require.NoError(t, migrations.CreatePartitions(ctx, pool, p, old))
	const keepers = 100_000
	_, err = pool.Exec(ctx, `INSERT INTO inboxmq_inbox (consumer, key, status, last_error, last_failed_at, first_seen_at, bucket)
		SELECT 'payments', 'order:' || g, 'dead', 'gateway refused', $1, $1, $1
		FROM generate_series(1, $2) g`, old, keepers)
	require.NoError(t, err)

	s, err := inbox.NewStore(pool, nil)

	if err == nil {

		err = s.Check(ctx)

	}
	require.NoError(t, err)
	r, err := inbox.NewRetention(s, &inbox.RetentionConfig{Window: 24 * time.Hour, BatchDelay: -1})
	require.NoError(t, err)
	current := p.Bucket(dbNow(t, pool))
	start := time.Now()
	run, err := r.RunOnce(ctx)
	took := time.Since(start)
	require.NoError(t, err)
	t.Logf("retention moved %d keepers in %s (%d batches) and dropped %d partitions", run.Moved, took.Round(time.Millisecond), run.Batches, run.Partitions)

	require.Equal(t, int64(keepers), run.Moved)
	require.Zero(t, run.Kept)
	var oldLeft bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, p.PartitionName(old)).Scan(&oldLeft))
	require.False(t, oldLeft, "the expired partition is dropped")
	var expired int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid,
		LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)') m
		WHERE i.inhparent = to_regclass($1) AND m[1]::timestamptz <= now() - interval '24 hours'`, p.Table).Scan(&expired))
	require.Zero(t, expired, "no partition that ended before the cut-off is left")
	var total, moved int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE bucket >= $1 AND status = 'dead')
		FROM inboxmq_inbox`, current).Scan(&total, &moved))
	require.Equal(t, keepers, total, "no keeper is lost")
	require.Equal(t, keepers, moved, "every keeper is in the current partition")
}
