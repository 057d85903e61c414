package inboxtest_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtest"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/redistest"
	"github.com/inboxmq/inboxmq/middleware"
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
	store   *inbox.Store
	faults  *inboxtest.Faults
	rdb     redis.UniversalClient
	prefix  string
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
	b.store, err = inbox.NewStore(ctx, b.pool, nil)
	require.NoError(t, err)
	b.rdb, b.prefix = redistest.Client(t)
	b.subject = inboxtest.Subject{
		Queue: "payments",
		Message: func(n int) []byte {
			return fmt.Appendf(nil, `{"order_id":"o-%d","amount_cents":%d}`, n, 100+n)
		},
		Effects: func(ctx context.Context, key string) (int, error) {
			var n int
			err := b.pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE order_id = $1`, strings.TrimPrefix(key, "payment:")).Scan(&n)
			return n, err
		},
		Faults:     b.faults,
		FlushRedis: inboxtest.FlushPrefix(b.scan, b.del, b.prefix),
	}
	return b
}

func (b *testBundle) scan(ctx context.Context, pattern string) ([]string, error) {
	return b.rdb.Keys(ctx, pattern).Result()
}

func (b *testBundle) del(ctx context.Context, keys ...string) error {
	return b.rdb.Del(ctx, keys...).Err()
}

// router registers h behind the completed-cache and the Redis lock, both
// under the test's key prefix.
func (b *testBundle) router(t *testing.T, h inboxtype.Handler[Payment]) *consumer.Router {
	t.Helper()
	r := consumer.NewRouter()
	lck, err := middleware.Lock(b.rdb, &middleware.LockOpts{Prefix: b.prefix + "lock:"})
	require.NoError(t, err)
	consumer.Register(r, "payments", h, &consumer.HandlerOpts{Middleware: []inboxtype.Middleware{
		middleware.Cache(b.rdb, &middleware.CacheOpts{Prefix: b.prefix + "done:"}),
		lck,
	}})
	return r
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
	b.subject.Router = b.router(t, inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[Payment]) error {
		_, err := tx.Exec(ctx, `INSERT INTO ledger_entries (order_id, amount_cents) VALUES ($1, $2)`, msg.Body.OrderID, msg.Body.AmountCents)
		return err
	}, nil))

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

func TestHandlerWithoutInboxFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Not behind the inbox: every copy writes again.
	b.subject.Router = b.router(t, inboxtype.HandlerFunc[Payment](func(ctx context.Context, msg *inboxtype.Message[Payment]) error {
		_, err := b.pool.Exec(ctx, `INSERT INTO ledger_entries (order_id, amount_cents) VALUES ($1, $2)`, msg.Body.OrderID, msg.Body.AmountCents)
		return err
	}))
	rec := runRecorded(b.subject)
	all := strings.Join(rec.errors, "\n")
	// Sequential and concurrent copies are absorbed by the completed-cache
	// and the Redis lock, but a copy after a flush is not: Redis is only an
	// accelerator.
	require.Contains(t, all, "inboxtest: redis flush between copies")
	require.Contains(t, all, "effect happened 2 times")
	require.Contains(t, all, "the handler does not commit through the instrumented pool")
}

func TestWritesOutsideTheInboxTransactionFail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Behind the inbox, but the write goes through the pool, not tx: it
	// survives a failed COMMIT and is made again on redelivery.
	b.subject.Router = b.router(t, inbox.Handler(b.store, func(ctx context.Context, _ pgx.Tx, msg *inboxtype.Message[Payment]) error {
		_, err := b.pool.Exec(ctx, `INSERT INTO ledger_entries (order_id, amount_cents) VALUES ($1, $2)`, msg.Body.OrderID, msg.Body.AmountCents)
		return err
	}, nil))
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
	b.subject.Router = b.router(t, inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[Payment]) error {
		_, err := tx.Exec(ctx, `INSERT INTO ledger_entries (order_id, amount_cents) VALUES ($1, $2)`, msg.Body.OrderID, msg.Body.AmountCents)
		return err
	}, nil))
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
	require.ErrorContains(t, err, "Subject needs Router, Queue, Message and Effects")
	_, err = inboxtest.Check(t.Context(), inboxtest.Subject{Router: consumer.NewRouter(), Queue: "q",
		Message: func(int) []byte { return nil }, Effects: func(context.Context, string) (int, error) { return 0, nil }})
	require.ErrorContains(t, err, `queue "q" has no handler`)
}

func TestClaimHandlerPasses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.subject.Router = b.router(t, inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[Payment]) error {
		return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO ledger_entries (order_id, amount_cents) VALUES ($1, $2)`, msg.Body.OrderID, msg.Body.AmountCents)
			return err
		})
	}, nil))
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
