package inboxtest_test

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtest"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/redistest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// Payment is the payload of the tests: its business identity is OrderID.
type Payment struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

// IdempotencyKey implements inboxtype.Keyer.
func (p Payment) IdempotencyKey() string { return "payment:" + p.OrderID }

type testBundle struct {
	pool    *pgxpool.Pool // instrumented with faults
	faults  *inboxtest.Faults
	rdb     redis.UniversalClient
	queue   string
	subject inboxtest.Subject
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx := t.Context()
	_, schema := pgtest.Schema(t)
	b := &testBundle{faults: &inboxtest.Faults{}}
	cfg, err := pgxpool.ParseConfig(pgtest.URL(schema))
	require.NoError(t, err)
	cfg.MaxConns = 8
	b.faults.Instrument(cfg)
	b.pool, err = pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(b.pool.Close)
	_, err = b.pool.Exec(ctx, `CREATE TABLE ledger_entries (id bigserial PRIMARY KEY, order_id text NOT NULL, amount_cents bigint NOT NULL)`)
	require.NoError(t, err)
	b.rdb, _ = redistest.Client(t)
	// The worker's cache and lock keys name the route's namespace: the
	// test's own queue name.
	b.queue = amqptest.QueueName(t)
	b.subject = inboxtest.Subject{
		Queue: b.queue,
		Message: func(n int) []byte {
			return fmt.Appendf(nil, `{"order_id":"o-%d","amount_cents":%d}`, n, 100+n)
		},
		Effects: func(ctx context.Context, key string) (int, error) {
			var n int
			err := b.pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE order_id = $1`, strings.TrimPrefix(key, "payment:")).Scan(&n)
			return n, err
		},
		Faults:     b.faults,
		FlushRedis: b.flush,
	}
	return b
}

// flush deletes the Redis keys of the test's namespace: the route's
// completed-cache entries and locks.
func (b *testBundle) flush(ctx context.Context) error {
	keys, err := b.rdb.Keys(ctx, "*"+b.queue+"*").Result()
	if err != nil || len(keys) == 0 {
		return err
	}
	return b.rdb.Del(ctx, keys...).Err()
}

// worker builds (not starts) a worker with Redis, whose route the register
// function adds on the test's queue; a route with opts nil takes the lock.
func (b *testBundle) worker(t *testing.T, register func(r *inboxmq.Routes, queue string, opts *inboxmq.RouteOpts)) *inboxmq.Worker {
	t.Helper()
	routes := inboxmq.NewRoutes()
	register(routes, b.queue, &inboxmq.RouteOpts{Lock: &inboxmq.LockOpts{}})
	w, err := inboxmq.NewWorker(&inboxmq.Config{
		URL: testenv.AMQPURL(), DB: b.pool, Redis: b.rdb, Routes: routes,
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	return w
}

// ledger is the transactional handler under test: one ledger entry per
// payment, written through the inbox's transaction.
func ledger(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[Payment]) error {
	_, err := tx.Exec(ctx, `INSERT INTO ledger_entries (order_id, amount_cents) VALUES ($1, $2)`, msg.Body.OrderID, msg.Body.AmountCents)
	return err
}

// recorder is a testing.TB that records failures instead of failing.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	errors []string
	logs   []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

// runRecorded runs inboxtest.Run against a recorder and returns it.
func runRecorded(s inboxtest.Subject) *recorder {
	rec := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		inboxtest.Run(rec, s)
	}()
	<-done
	return rec
}

func TestInboxHandlerPasses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.subject.Worker = b.worker(t, func(r *inboxmq.Routes, q string, o *inboxmq.RouteOpts) { inboxmq.HandleTx(r, q, ledger, o) })

	results, err := inboxtest.Check(t.Context(), b.subject)
	require.NoError(t, err)
	require.Len(t, results, len(inboxtest.Scenarios))
	for _, r := range results {
		require.Empty(t, r.NotRun, r.Scenario)
		require.Empty(t, r.Failures, "%s: outcomes %v", r.Scenario, r.Outcomes)
		require.Equal(t, 1, r.Effects, r.Scenario)
		require.NotEmpty(t, r.Key, r.Scenario)
	}
	// The crash scenario really crashed: the first delivery failed at its
	// COMMIT and was retried.
	require.Contains(t, strings.Join(results[2].Outcomes, " "), "commit#1:retry,succeeded")

	rec := runRecorded(b.subject)
	require.Empty(t, rec.errors)
}

func TestWritesOutsideTheInboxTransactionFail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Behind the inbox, but the write goes through the pool, not tx: it
	// survives a failed COMMIT and is made again on redelivery.
	b.subject.Worker = b.worker(t, func(r *inboxmq.Routes, q string, o *inboxmq.RouteOpts) {
		inboxmq.HandleTx(r, q, func(ctx context.Context, _ pgx.Tx, msg *inboxtype.Message[Payment]) error {
			_, err := b.pool.Exec(ctx, `INSERT INTO ledger_entries (order_id, amount_cents) VALUES ($1, $2)`, msg.Body.OrderID, msg.Body.AmountCents)
			return err
		}, o)
	})
	results, err := inboxtest.Check(t.Context(), b.subject)
	require.NoError(t, err)
	byName := map[string]*inboxtest.Result{}
	for _, r := range results {
		byName[r.Scenario] = r
	}
	crash := byName[inboxtest.CrashBeforeCommit]
	require.False(t, crash.OK())
	require.Contains(t, strings.Join(crash.Failures, "\n"), "effect happened 2 times")
	require.True(t, byName[inboxtest.SequentialDuplicates].OK(), "plain duplicates are still caught by the inbox")

	rec := runRecorded(b.subject)
	require.NotEmpty(t, rec.errors)
	require.Contains(t, strings.Join(rec.errors, "\n"), "inboxtest: crash before commit")
}

func TestUninstrumentedPoolIsReported(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.subject.Faults = &inboxtest.Faults{} // armed, but on no pool
	b.subject.Worker = b.worker(t, func(r *inboxmq.Routes, q string, o *inboxmq.RouteOpts) { inboxmq.HandleTx(r, q, ledger, o) })
	rec := runRecorded(b.subject)
	require.Contains(t, strings.Join(rec.errors, "\n"), "is the inbox store's pool instrumented with Faults.Instrument?)")

	b.subject.Faults = nil
	rec = runRecorded(b.subject)
	require.Empty(t, rec.errors)
	require.Contains(t, strings.Join(rec.logs, "\n"), "crash before commit: not run: Subject.Faults is nil")
}

func TestSubjectValidation(t *testing.T) {
	t.Parallel()
	_, err := inboxtest.Check(t.Context(), inboxtest.Subject{})
	require.ErrorContains(t, err, "Subject needs Worker, Queue, Message and Effects")
	b := setup(t)
	w := b.worker(t, func(r *inboxmq.Routes, q string, o *inboxmq.RouteOpts) { inboxmq.HandleTx(r, q, ledger, o) })
	_, err = inboxtest.Check(t.Context(), inboxtest.Subject{Worker: w, Queue: "q",
		Message: func(int) []byte { return nil }, Effects: func(context.Context, string) (int, error) { return 0, nil }})
	require.ErrorContains(t, err, `queue "q" has no route in the worker`)
}

func TestClaimHandlerPasses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.subject.Worker = b.worker(t, func(r *inboxmq.Routes, q string, o *inboxmq.RouteOpts) {
		inboxmq.HandleClaim(r, q, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[Payment]) error {
			return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error { return ledger(ctx, tx, msg) })
		}, o)
	})
	results, err := inboxtest.Check(t.Context(), b.subject)
	require.NoError(t, err)
	for _, r := range results {
		require.Empty(t, r.NotRun, r.Scenario)
		require.Empty(t, r.Failures, "%s: outcomes %v", r.Scenario, r.Outcomes)
		require.Equal(t, 1, r.Effects, r.Scenario)
	}
	// Claim mode commits twice (the claim, then the completion): the crash
	// scenario failed each in turn.
	crash := strings.Join(results[2].Outcomes, " ")
	require.Contains(t, crash, "commit#1:")
	require.Contains(t, crash, "commit#2:", crash)
}
