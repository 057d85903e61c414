package migrations_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/migrations"
)

func TestPartitionInbox_InvalidConfig(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.SchemaWith(t, 2)
	for _, c := range []migrations.PartitionConfig{
		{Width: 1500 * time.Millisecond},
		{Width: -time.Hour},
		{Ahead: -1},
		{Table: "a.b.c"},
		{Table: "inbox; DROP TABLE x"},
		{Table: "a_table_name_that_is_far_too_long_for_the_partition_suffix"},
	} {
		_, err := migrations.PartitionInbox(t.Context(), pool, &c)
		require.Error(t, err, "%+v", c)
	}
}

// Concurrent conversions are serialised: one converts, the others find a
// partitioned table and only top up the partitions ahead.
func TestPartitionInbox_ConcurrentAndIdempotent(t *testing.T) {
	t.Parallel()
	if pgtest.Partitioned() {
		t.Skip("the schema is partitioned already")
	}
	pool, schema := pgtest.Schema(t)
	_, err := pool.Exec(t.Context(), `INSERT INTO inboxmq_inbox (consumer, key, status, completed_at)
		SELECT 'c', 'k' || g, 'completed', now() - g * interval '1 hour' FROM generate_series(1, 30) g`)
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		p := pgtest.Pool(t, schema, 2)
		wg.Go(func() {
			_, errs[i] = migrations.PartitionInbox(t.Context(), p, &migrations.PartitionConfig{Width: 6 * time.Hour, Ahead: 1})
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	p, err := migrations.LoadPartitioning(t.Context(), pool, "")
	require.NoError(t, err)
	require.Equal(t, 6*time.Hour, p.Width)
	require.Equal(t, 1, p.Ahead)
	var rows, parts int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM inboxmq_inbox),
		(SELECT count(*) FROM pg_inherits WHERE inhparent = 'inboxmq_inbox'::regclass)`).Scan(&rows, &parts))
	require.Equal(t, 30, rows)
	require.GreaterOrEqual(t, parts, 6) // 30 hours back in 6-hour buckets, and one ahead
	require.LessOrEqual(t, parts, 8)
}

func TestPartitioning_Bucket(t *testing.T) {
	t.Parallel()
	p := &migrations.Partitioning{Width: 24 * time.Hour, Origin: time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)}
	for in, want := range map[string]string{
		"2026-12-03T16:11:00Z": "2026-12-03T00:00:00Z",
		"2026-12-03T00:00:00Z": "2026-12-03T00:00:00Z",
		"1999-12-31T23:59:59Z": "1999-12-31T00:00:00Z",
		"1999-12-31T00:00:00Z": "1999-12-31T00:00:00Z",
	} {
		ts, err := time.Parse(time.RFC3339, in)
		require.NoError(t, err)
		require.Equal(t, want, p.Bucket(ts).Format(time.RFC3339), in)
	}
}
