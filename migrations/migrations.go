// Package migrations holds inboxmq's PostgreSQL schema as plain SQL files,
// embedded in the binary, and applies them with goose under a PostgreSQL
// advisory lock, so two processes migrating at once are safe.
//
// Tables are created in the first schema of the connection's search_path;
// every inboxmq table is prefixed inboxmq_, and the version table is
// inboxmq_schema_migrations.
//
//	if err := migrations.Up(ctx, pool); err != nil { … }
package migrations

import (
	"context"
	"embed"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// FS holds the SQL migrations (goose format, numbered NNNNN_name.sql).
//
//go:embed *.sql
var FS embed.FS

// VersionTable is the table in which applied migrations are recorded.
const VersionTable = "inboxmq_schema_migrations"

// Up applies every pending inboxmq migration to the database behind pool. It
// is safe to call concurrently from several processes and to call again:
// applied migrations are skipped.
func Up(ctx context.Context, pool *pgxpool.Pool) error {
	return UpFS(ctx, pool, FS, VersionTable)
}

// UpFS applies the goose migrations in fsys (SQL files at its root),
// recording them in versionTable. Applications use it for their own tables
// (the payment-worker does), with a version table of their own.
func UpFS(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, versionTable string) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return fmt.Errorf("migrations: locker: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithTableName(versionTable),
		goose.WithSessionLocker(locker),
	)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrations: up: %w", err)
	}
	return nil
}
