package migrations_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/migrations"
)

// Several processes (here: pools) migrating one schema at once are safe, and
// a second run is a no-op.
func TestUpConcurrentAndIdempotent(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t) // already migrated once
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		p := pgtest.Pool(t, schema, 2)
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = migrations.Up(ctx, p) }()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	var tables int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables
		WHERE table_schema = $1 AND table_name LIKE 'inboxmq\_%'`, schema).Scan(&tables))
	require.GreaterOrEqual(t, tables, 3, "inbox, outbox, controls and the version table")
	var applied int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM inboxmq_schema_migrations WHERE version_id > 0`).Scan(&applied))
	entries, err := migrations.FS.ReadDir(".")
	require.NoError(t, err)
	require.Equal(t, len(entries), applied, "each embedded migration applied exactly once")
}
