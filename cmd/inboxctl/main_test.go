package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/internal/ops"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).triggerHealthCheck.func1"),
	)
}

// result is one in-process run of inboxctl.
type result struct {
	code        int
	out, errOut string
}

// json decodes the run's stdout into v.
func (r result) json(t *testing.T, v any) {
	t.Helper()
	require.NoError(t, json.Unmarshal([]byte(r.out), v), r.out)
}

type cliBundle struct {
	pool   *pgxpool.Pool
	schema string
	env    map[string]string
}

func setup(t *testing.T) *cliBundle {
	t.Helper()
	pool, schema := pgtest.Schema(t)
	return &cliBundle{pool: pool, schema: schema, env: map[string]string{
		"DATABASE_URL": pgtest.URL(schema),
		"AMQP_URL":     testenv.AMQPURL(),
		"USER":         "tester",
	}}
}

// run executes inboxctl with args in process.
func (b *cliBundle) run(t *testing.T, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(t.Context(), args, &out, &errOut, func(k string) string { return b.env[k] })
	return result{code: code, out: out.String(), errOut: errOut.String()}
}

func (b *cliBundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

func TestHelpEverywhere(t *testing.T) {
	t.Parallel()
	b := &cliBundle{env: map[string]string{}}
	for _, args := range [][]string{
		{"--help"},
		{"migrate", "--help"},
		{"status", "--help"},
		{"stale", "--help"},
		{"reconcile", "--help"},
		{"stats", "--help"},
		{"purge", "--help"},
		{"dlq", "--help"},
		{"dlq", "list", "--help"},
		{"dlq", "replay", "--help"},
		{"dlq", "purge", "--help"},
		{"pause", "--help"},
		{"resume", "--help"},
		{"concurrency", "--help"},
		{"block", "--help"},
		{"unblock", "--help"},
		{"controls", "--help"},
		{"workers", "--help"},
		{"lint", "--help"},
		{"ui", "--help"},
	} {
		r := b.run(t, args...)
		require.Equal(t, exitOK, r.code, args)
		require.Contains(t, r.out, "Usage:", args)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"nosuch"}, "unknown command"},
		{[]string{"status"}, "accepts 1 arg"},
		{[]string{"status", "k"}, `required flag(s) "namespace"`},
		{[]string{"purge"}, `required flag(s) "older-than"`},
		{[]string{"purge", "--older-than", "-1h"}, "positive duration"},
		{[]string{"stats", "--output", "yaml"}, "text or json"},
		{[]string{"concurrency", "payments", "two"}, "non-negative"},
		{[]string{"block", "k", "--prefix", "p", "--namespace", "c"}, "not both"},
		{[]string{"block", "--namespace", "c"}, "KEY or --prefix"},
		{[]string{"dlq", "purge", "payments"}, "--yes"},
		{[]string{"dlq", "list", "bad name"}, "invalid queue name"},
	} {
		r := b.run(t, tc.args...)
		require.Equal(t, exitUsage, r.code, "%v: %s", tc.args, r.errOut)
		require.Contains(t, r.errOut, tc.msg, tc.args)
	}
}

func TestMissingURLsAreUsageErrors(t *testing.T) {
	t.Parallel()
	b := &cliBundle{env: map[string]string{}}
	r := b.run(t, "stats")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.errOut, "DATABASE_URL")
	r = b.run(t, "dlq", "list", "payments")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.errOut, "AMQP_URL")
}

// Credentials never reach the output, even in connection errors.
func TestCredentialsRedacted(t *testing.T) {
	t.Parallel()
	b := &cliBundle{env: map[string]string{
		"DATABASE_URL": "postgres://postgres:s3cr3t-pw@127.0.0.1:5432/inboxmq_no_such_db?sslmode=disable",
		"AMQP_URL":     "amqp://guest:an0ther-pw@127.0.0.1:5672/no-such-vhost",
	}}
	r := b.run(t, "stats")
	require.Equal(t, exitFailure, r.code)
	require.NotContains(t, r.errOut+r.out, "s3cr3t-pw")
	require.Contains(t, r.errOut, "xxxxx")
	r = b.run(t, "dlq", "list", "payments")
	require.Equal(t, exitFailure, r.code)
	require.NotContains(t, r.errOut+r.out, "an0ther-pw")
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	// A bare schema: pgtest.Schema would migrate it already.
	schema := pgtest.SchemaName(t)
	admin, err := pgx.Connect(t.Context(), testenv.DatabaseURL())
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", err)
	}
	defer admin.Close(context.Background())
	_, err = admin.Exec(t.Context(), "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), testenv.DatabaseURL())
		if err == nil {
			_, _ = c.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
			_ = c.Close(context.Background())
		}
	})
	b := &cliBundle{env: map[string]string{"DATABASE_URL": pgtest.URL(schema)}}

	for range 2 { // idempotent
		r := b.run(t, "migrate", "-o", "json")
		require.Equal(t, exitOK, r.code, r.errOut)
		var v struct{ Version int64 }
		r.json(t, &v)
		require.GreaterOrEqual(t, v.Version, int64(3))
	}
	var tables int
	require.NoError(t, admin.QueryRow(t.Context(), `SELECT count(*) FROM pg_tables WHERE schemaname = $1
		AND tablename IN ('inboxmq_inbox', 'inboxmq_controls', 'inboxmq_blocks')`, schema).Scan(&tables))
	require.Equal(t, 3, tables)
	r := b.run(t, "migrate")
	require.Regexp(t, `^migrated: schema version \d+\n$`, r.out)
}

func TestStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status, fence, owner, attempts, deliveries, last_error, message_id, completed_at, result)
		VALUES ('payments', 'payment:42', 'completed', 2, 'w1', 3, 4, 'gateway 503', 'm-42', now(), '{"charge_id": "ch_1"}')`)

	r := b.run(t, "status", "payment:42", "--namespace", "payments")
	require.Equal(t, exitOK, r.code, r.errOut)
	for _, line := range []string{
		"namespace:", "key:", "status:", "fence:", "owner:", "lease_until:", "attempts (broker attempt):",
		"redeliveries (crash counter):", "last_error:", "message_id:", "first_seen_at:", "completed_at:",
	} {
		require.Contains(t, r.out, line)
	}
	require.Regexp(t, `(?m)^status:\s+completed$`, r.out)
	require.Regexp(t, `(?m)^lease_until:\s+-$`, r.out)
	require.Regexp(t, `(?m)^last_error:\s+gateway 503$`, r.out)
	require.Regexp(t, `(?m)^result:\s+\{"charge_id": "ch_1"\}$`, r.out)

	r = b.run(t, "status", "payment:42", "--namespace", "payments", "-o", "json")
	require.Equal(t, exitOK, r.code, r.errOut)
	var v recordView
	r.json(t, &v)
	require.Equal(t, "completed", v.Status)
	require.Equal(t, int64(2), v.Fence)
	require.Equal(t, 3, v.Attempts)
	require.Equal(t, 4, v.Redeliveries)
	require.NotNil(t, v.CompletedAt)
	require.JSONEq(t, `{"charge_id":"ch_1"}`, string(v.Result))

	require.Empty(t, v.Breakers)

	// A worker's breaker on the consumer shows with the key's row.
	b.exec(t, `INSERT INTO inboxmq_breakers (consumer, downstream, worker, state) VALUES ('payments', 'gateway', 'w1', 'open')`)
	r = b.run(t, "status", "payment:42", "--namespace", "payments")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Regexp(t, `(?m)^payments\s+gateway\s+w1\s+open\s+\S+$`, r.out)
	r = b.run(t, "status", "payment:42", "--namespace", "payments", "-o", "json")
	r.json(t, &v)
	require.Len(t, v.Breakers, 1)
	require.Equal(t, "open", v.Breakers[0].State)

	r = b.run(t, "status", "payment:43", "--namespace", "payments")
	require.Equal(t, exitNotFound, r.code)
	require.Contains(t, r.errOut, "no inbox row")
}

func TestStaleAndReconcileDryRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status, owner, fence, lease_until, last_error) VALUES
		('payments', 'payment:1', 'processing', 'worker-dead', 4, now() - interval '10 minutes', 'timeout'),
		('payments', 'payment:2', 'processing', 'worker-live', 1, now() + interval '10 minutes', NULL)`)

	r := b.run(t, "stale")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, "NAMESPACE")
	require.Contains(t, r.out, "payment:1")
	require.Contains(t, r.out, "worker-dead")
	require.NotContains(t, r.out, "payment:2")

	r = b.run(t, "stale", "--older-than", "1h", "-o", "json")
	require.Equal(t, exitOK, r.code, r.errOut)
	var none []recordView
	r.json(t, &none)
	require.Empty(t, none)

	r = b.run(t, "reconcile", "--dry-run", "-o", "json")
	require.Equal(t, exitOK, r.code, r.errOut)
	var dry reconcileView
	r.json(t, &dry)
	require.True(t, dry.DryRun)
	require.Len(t, dry.Claims, 1)
	require.Equal(t, "payment:1", dry.Claims[0].Key)
	require.Equal(t, inbox.ActionNone, dry.Claims[0].Action)
	status := func(key string) string {
		var s string
		require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT status FROM inboxmq_inbox WHERE key = $1`, key).Scan(&s))
		return s
	}
	require.Equal(t, "processing", status("payment:1"), "a dry run changes nothing")

	r = b.run(t, "reconcile")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, "reconciled 1 stale claims: 1 released, 0 dead, 0 completed\n")
	require.Regexp(t, `(?m)^payments\s+payment:1\s+worker-dead\s+4\s+\d+\s+\S+\s+released\s+timeout$`, r.out)
	require.Equal(t, "failed", status("payment:1"))
	require.Equal(t, "processing", status("payment:2"), "a live claim is not touched")

	r = b.run(t, "reconcile", "--grace", "-1s")
	require.Equal(t, exitUsage, r.code, r.errOut)
}

func TestPurge(t *testing.T) {
	t.Parallel()
	if pgtest.Partitioned() {
		t.Skip("row-by-row purge: TestPartition_ThenStatusStatsAndPurge covers the partitioned table")
	}
	b := setup(t)
	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status, completed_at)
		SELECT 'payments', 'old:' || g, 'completed', now() - interval '10 days' FROM generate_series(1, 25) g`)
	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status, completed_at)
		SELECT 'payments', 'new:' || g, 'completed', now() FROM generate_series(1, 5) g`)

	r := b.run(t, "purge", "--older-than", "168h", "--batch-size", "10")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, "deleted 25 completed rows in 3 batches\n", r.out)
	r = b.run(t, "purge", "--older-than", "168h", "-o", "json")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.JSONEq(t, `{"deleted": 0, "batches": 1, "skipped": false}`, r.out)
	var left int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM inboxmq_inbox`).Scan(&left))
	require.Equal(t, 5, left)
}

func TestStats(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status, completed_at)
		SELECT 'payments', 'p:' || g, 'completed', now() FROM generate_series(1, 7) g`)
	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status, lease_until, updated_at) VALUES
		('emails', 'e:1', 'processing', now() - interval '1 minute', now() - interval '5 minutes'),
		('emails', 'e:2', 'failed', NULL, now())`)

	r := b.run(t, "stats", "-o", "json")
	require.Equal(t, exitOK, r.code, r.errOut)
	var v ops.Stats
	r.json(t, &v)
	require.Equal(t, []ops.StatusCount{
		{Namespace: "emails", Status: "failed", Count: 1},
		{Namespace: "emails", Status: "processing", Count: 1},
		{Namespace: "payments", Status: "completed", Count: 7},
	}, v.Rows)
	require.NotNil(t, v.OldestClaimAgeSeconds)
	require.InDelta(t, 300, *v.OldestClaimAgeSeconds, 60)
	require.Equal(t, int64(1), v.StaleClaims)
	require.Positive(t, v.TableBytes)
	require.Positive(t, v.IndexBytes)
	require.GreaterOrEqual(t, v.TotalBytes, v.TableBytes+v.IndexBytes)

	r = b.run(t, "stats")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Regexp(t, `(?m)^payments\s+completed\s+7$`, r.out)
	require.Regexp(t, `(?m)^oldest claim: 5m\d*s?$`, r.out)
	require.Contains(t, r.out, "stale claims: 1\n")
	require.True(t, strings.Contains(r.out, "KiB"), r.out)
}
