package inbox_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// sqlTracer records the SQL of every statement sent on a pool.
type sqlTracer struct {
	mu  sync.Mutex
	sql []string
}

func (tr *sqlTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	tr.mu.Lock()
	tr.sql = append(tr.sql, d.SQL)
	tr.mu.Unlock()
	return ctx
}

func (tr *sqlTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// matching returns the recorded statements that contain all of parts.
func (tr *sqlTracer) matching(parts ...string) []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []string
	for _, s := range tr.sql {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(s, p)
		}
		if ok {
			out = append(out, s)
		}
	}
	return out
}

// Claims of concurrent deliveries that arrive while a claim statement is
// under way share the next one, and each keeps its own verdict: free keys
// are claimed and completed once, a completed key is a duplicate, a second
// delivery of a key in the same round waits for the next round and meets
// the first one's claim, and a round with a DurableClaim member commits
// durably.
func TestClaim_ConcurrentClaimsShareOneStatement(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tr := &sqlTracer{}
	pool := tracedPool(t, tr)
	b := setupOn(t, pool, nil)
	async := completingClaimHandler(b, nil)
	durable := completingClaimHandler(b, &inbox.ClaimOpts{DurableClaim: true})
	const shared = `unnest($1::text[], $2::text[], $3::text[], $4::bigint[]`

	// A key that is already done.
	require.NoError(t, async.Handle(ctx, newMsg(t, "pay", order{OrderID: "done", Amount: 1}, false)))
	// The first claim waits on a row another transaction holds.
	blocker, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(ctx) }()
	_, err = blocker.Exec(ctx, `INSERT INTO inboxmq_inbox (consumer, key, status) VALUES ('pay', 'order:x', 'failed')`)
	require.NoError(t, err)
	before := len(tr.matching("'processing'"))
	xDone := make(chan error, 1)
	go func() { xDone <- async.Handle(ctx, newMsg(t, "pay", order{OrderID: "x", Amount: 1}, false)) }()
	testenv.WaitFor(t, "the first claim sent", func() bool { return len(tr.matching("'processing'")) > before })

	type call struct {
		h  consumer.Handler[order]
		id string
	}
	calls := []call{{async, "y1"}, {async, "y2"}, {async, "y1"}, {async, "done"}, {durable, "z"}}
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	for i, c := range calls {
		wg.Go(func() { errs[i] = c.h.Handle(ctx, newMsg(t, "pay", order{OrderID: c.id, Amount: 1}, false)) })
		testenv.WaitFor(t, "queued in order", func() bool { return inbox.LeasesQueued(b.store) == i+1 })
	}
	require.NoError(t, blocker.Commit(ctx))
	require.NoError(t, testenv.WaitChan(t, xDone, "the first delivery"))
	wg.Wait()

	rounds := tr.matching(shared)
	require.Len(t, rounds, 1, "y1, y2, done and z shared one claim statement")
	require.NotContains(t, rounds[0], "set_config", "a round with a durable claim commits durably")
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.Error(t, errs[2], "the second y1 met the first one's claim or completion")
	require.ErrorIs(t, errs[3], retry.ErrDuplicate)
	require.NoError(t, errs[4])
	for key, want := range map[string]int{"order:x": 1, "order:y1": 1, "order:y2": 1, "order:z": 1, "order:done": 1} {
		require.Equal(t, want, b.count(t, `SELECT count(*) FROM effects WHERE key = $1`, key), key)
		require.Equal(t, "completed", b.get(t, "pay", key).Status, key)
	}
}

// Many deliveries of few keys claimed concurrently through shared
// statements: each key's effect is written exactly once, and every
// delivery either completed it or was told it is a duplicate or held.
func TestClaim_SharedClaimsUnderConcurrencyOneEffectPerKey(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, nil)
	h := completingClaimHandler(b, nil)
	const deliveries, keys = 120, 15
	errs := make([]error, deliveries)
	var wg sync.WaitGroup
	for i := range deliveries {
		wg.Go(func() {
			errs[i] = h.Handle(ctx, newMsg(t, "pay", order{OrderID: string(rune('a' + i%keys)), Amount: 1}, false))
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			require.True(t, errorsIsDuplicateOrRetry(err), "delivery %d: %v", i, err)
		}
	}
	require.Equal(t, keys, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, keys, b.count(t, `SELECT count(DISTINCT key) FROM effects`))
	require.Equal(t, keys, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE status = 'completed'`))
}

func errorsIsDuplicateOrRetry(err error) bool {
	c := retry.Classify(err)
	return c.Kind == retry.KindDuplicate || c.Kind == retry.KindRetry
}
