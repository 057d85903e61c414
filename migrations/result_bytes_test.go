package migrations_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/migrations"
)

// Migration 00005 makes the inbox's result column json, which keeps the
// text a result was written with, on a partitioned inbox too: every
// partition, and every partition created afterwards. A result written
// before keeps jsonb's text; its Down migration goes back to jsonb.
func TestResultBytes_MigratesAPartitionedInbox(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := pgtest.SchemaWith(t, 2)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS, goose.WithTableName(migrations.VersionTable))
	require.NoError(t, err)
	_, err = p.DownTo(ctx, 4)
	require.NoError(t, err)
	resultTypes := func() map[string]string {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT c.relid::text, format_type(a.atttypid, a.atttypmod)
			FROM pg_partition_tree('inboxmq_inbox') c JOIN pg_attribute a ON a.attrelid = c.relid AND a.attname = 'result'`)
		require.NoError(t, err)
		types := map[string]string{}
		for rows.Next() {
			var rel, typ string
			require.NoError(t, rows.Scan(&rel, &typ))
			types[rel] = typ
		}
		require.NoError(t, rows.Err())
		return types
	}
	for rel, typ := range resultTypes() {
		require.Equal(t, "jsonb", typ, "%s before 00005", rel)
	}

	const odd = `{"b":1,  "a":[2,1]}`
	_, err = pool.Exec(ctx, `INSERT INTO inboxmq_inbox (consumer, key, status, completed_at, result)
		VALUES ('c', 'before', 'completed', now(), $1::jsonb)`, odd)
	require.NoError(t, err)
	part, err := migrations.PartitionInbox(ctx, pool, &migrations.PartitionConfig{Width: time.Hour, Ahead: 1})
	require.NoError(t, err)
	require.NoError(t, migrations.Up(ctx, pool))
	part.Ahead += 2 // partitions created after the migration
	require.NoError(t, migrations.CreatePartitions(ctx, pool, part, time.Now()))

	types := resultTypes()
	require.Greater(t, len(types), 4, "the table, its partitions and those created since: %v", types)
	for rel, typ := range types {
		require.Equal(t, "json", typ, "%s after 00005", rel)
	}
	_, err = pool.Exec(ctx, `INSERT INTO inboxmq_inbox (consumer, key, status, completed_at, result)
		VALUES ('c', 'after', 'completed', now(), $1::json)`, odd)
	require.NoError(t, err)
	got := map[string]string{}
	rows, err := pool.Query(ctx, `SELECT key, result::text FROM inboxmq_inbox WHERE consumer = 'c'`)
	require.NoError(t, err)
	for rows.Next() {
		var k, v string
		require.NoError(t, rows.Scan(&k, &v))
		got[k] = v
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]string{"before": `{"a": [2, 1], "b": 1}`, "after": odd}, got)

	_, err = p.DownTo(ctx, 4)
	require.NoError(t, err)
	for rel, typ := range resultTypes() {
		require.Equal(t, "jsonb", typ, "%s after 00005's Down", rel)
	}
}
