package main

import (
	"context"
	"embed"
	"fmt"
	"io/fs"

	"github.com/inboxmq/inboxmq/migrations"
)

// sqlFS holds the example's own migrations (payments, ledger_entries),
// embedded so that the binary runs from any folder.
//
//go:embed migrations/*.sql
var sqlFS embed.FS

// versionTable records the example's migrations, apart from the framework's.
const versionTable = "payment_worker_migrations"

// migrate applies the framework's migrations, then the example's. Both are
// idempotent and safe to run from several processes at once. The wait for
// PostgreSQL to answer is bounded by CONNECT_TIMEOUT; the migrations
// themselves are not (DDL may wait for locks).
func migrate(ctx context.Context, cfg config) error {
	pool, err := openPool(cfg, &tracing{}) // no spans for migrations
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer pool.Close()
	if err := pingDatabase(ctx, pool, cfg); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if err := migrations.Up(ctx, pool); err != nil {
		return fmt.Errorf("migrate: framework: %w", err)
	}
	sub, err := fs.Sub(sqlFS, "migrations")
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if err := migrations.UpFS(ctx, pool, sub, versionTable); err != nil {
		return fmt.Errorf("migrate: payment-worker: %w", err)
	}
	return nil
}
