// Package migrations holds inboxmq's PostgreSQL schema as plain SQL files,
// embedded in the binary, and applies them with goose under a PostgreSQL
// advisory lock (one per schema and version table), so two processes
// migrating at once are safe.
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
	"hash/fnv"
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
	// The advisory lock is per schema and version table: two processes
	// migrating the same schema wait for each other; other schemas (such as
	// per-test schemas) do not.
	var schema string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return fmt.Errorf("migrations: current schema: %w", err)
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(schema + "\x00" + versionTable))
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockID(int64(h.Sum64()&(1<<62-1))),
		lock.WithLockTimeout(1, 300), // retry every second, for up to 5 minutes
	)
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
