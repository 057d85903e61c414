package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/ops"
	"github.com/inboxmq/inboxmq/internal/pgtest"
)

func TestPartition_ThenStatusStatsAndPurge(t *testing.T) {
	t.Parallel()
	if pgtest.Partitioned() {
		t.Skip("partitions its own table: runs in the default test run")
	}
	b := setup(t)
	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status, completed_at)
		SELECT 'payments', 'old:' || g, 'completed', now() - interval '10 days' FROM generate_series(1, 25) g`)
	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status, completed_at)
		SELECT 'payments', 'new:' || g, 'completed', now() FROM generate_series(1, 5) g`)
	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status, last_error)
		VALUES ('payments', 'failed:1', 'failed', 'boom')`)

	r := b.run(t, "partition", "--width", "24h", "--ahead", "2", "-o", "json")
	require.Equal(t, exitOK, r.code, r.errOut)
	var got struct {
		Partitions int     `json:"partitions"`
		Width      float64 `json:"width_seconds"`
	}
	r.json(t, &got)
	require.GreaterOrEqual(t, got.Partitions, 13) // 10 days back to 2 ahead
	require.Equal(t, 86400.0, got.Width)
	r = b.run(t, "partition", "--width", "1500ms")
	require.Equal(t, exitUsage, r.code, r.errOut)

	r = b.run(t, "status", "old:1", "--namespace", "payments", "-o", "json")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, `"completed"`)

	r = b.run(t, "stats", "-o", "json")
	require.Equal(t, exitOK, r.code, r.errOut)
	var st ops.Stats
	r.json(t, &st)
	require.Positive(t, st.TotalBytes)

	r = b.run(t, "purge", "--older-than", "168h")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Regexp(t, `^dropped \d+ partitions \(about \d+ rows\), moved 0 rows to keep, 0 partitions left for a later pass\n$`, r.out)
	var left int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM inboxmq_inbox`).Scan(&left))
	require.Equal(t, 6, left)
	r = b.run(t, "status", "old:1", "--namespace", "payments")
	require.Equal(t, exitNotFound, r.code, r.out)
}
