// Package pgtest gives each test its own PostgreSQL schema with inboxmq's
// migrations applied, so tests run in parallel against one real database.
// It is for tests only; production code never imports it.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/migrations"
)

var (
	prepareOnce sync.Once
	errPrepare  error
)

// prepare creates the test database if it is missing and sweeps schemas that
// crashed runs left behind (older than an hour).
func prepare(ctx context.Context) error {
	prepareOnce.Do(func() {
		cfg, err := pgx.ParseConfig(testenv.DatabaseURL())
		if err != nil {
			errPrepare = err
			return
		}
		dbName := cfg.Database
		conn, err := pgx.ConnectConfig(ctx, cfg)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "3D000" { // invalid_catalog_name
			admin := cfg.Copy()
			admin.Database = "postgres"
			aconn, aerr := pgx.ConnectConfig(ctx, admin)
			if aerr != nil {
				errPrepare = aerr
				return
			}
			_, aerr = aconn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{dbName}.Sanitize())
			_ = aconn.Close(ctx)
			if aerr != nil && !errors.As(aerr, &pgErr) { // another package created it first
				errPrepare = aerr
				return
			}
			conn, err = pgx.ConnectConfig(ctx, cfg)
		}
		if err != nil {
			errPrepare = err
			return
		}
		defer conn.Close(ctx)
		rows, err := conn.Query(ctx, `SELECT nspname FROM pg_namespace WHERE nspname LIKE 't\_%'`)
		if err != nil {
			errPrepare = err
			return
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			errPrepare = err
			return
		}
		cutoff := time.Now().Add(-time.Hour).Unix()
		for _, n := range names {
			parts := strings.SplitN(n, "_", 3)
			if len(parts) < 3 {
				continue
			}
			if ts, err := strconv.ParseInt(parts[1], 10, 64); err == nil && ts < cutoff {
				_, _ = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{n}.Sanitize()+" CASCADE")
			}
		}
	})
	return errPrepare
}

var unsafeChars = regexp.MustCompile(`[^a-z0-9]+`)

// SchemaName returns a fresh schema name for t: t_<unix>_<random>_<test>.
func SchemaName(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := unsafeChars.ReplaceAllString(strings.ToLower(t.Name()), "_")
	s := fmt.Sprintf("t_%d_%s_%s", time.Now().Unix(), hex.EncodeToString(b[:]), name)
	if len(s) > 63 {
		s = s[:63]
	}
	return strings.TrimRight(s, "_")
}

// Schema creates a fresh schema, applies inboxmq's migrations there, and
// returns a pool whose search_path is that schema (and the schema's name).
// The pool is closed and the schema dropped when the test ends.
func Schema(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	return SchemaWith(t, 16)
}

// SchemaWith is Schema with a pool of maxConns connections.
func SchemaWith(t testing.TB, maxConns int32) (*pgxpool.Pool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
	defer cancel()
	if err := prepare(ctx); err != nil {
		testenv.Unavailable(t, "PostgreSQL", err)
	}
	schema := SchemaName(t)
	admin, err := pgx.Connect(ctx, testenv.DatabaseURL())
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, testenv.DatabaseURL())
		if err != nil {
			return
		}
		defer c.Close(ctx)
		_, _ = c.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	pool := Pool(t, schema, maxConns)
	if err := migrations.Up(ctx, pool); err != nil { // its advisory lock is per schema
		t.Fatalf("pgtest: migrate: %v", err)
	}
	if Partitioned() {
		if _, err := migrations.PartitionInbox(ctx, pool, &migrations.PartitionConfig{Width: time.Hour}); err != nil {
			t.Fatalf("pgtest: partition the inbox: %v", err)
		}
	}
	return pool, schema
}

// Partitioned reports whether the tests run on a partitioned inbox table
// (INBOXMQ_TEST_PARTITIONED=1): Schema then
// partitions the inbox table (hourly buckets) after the migrations.
func Partitioned() bool { return os.Getenv("INBOXMQ_TEST_PARTITIONED") == "1" }

// Pool opens a pool on the test database with search_path set to schema,
// closed when the test ends (before the schema is dropped).
func Pool(t testing.TB, schema string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL())
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// URL returns the test database URL with search_path set to schema, for
// code (such as a subprocess) that takes a URL rather than a pool.
func URL(schema string) string {
	u := testenv.DatabaseURL()
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	return u + sep + "search_path=" + schema
}
