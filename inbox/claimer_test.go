package inbox_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
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

// claimCall is one delivery of key id (order id) through h.
type claimCall struct {
	h  inboxtype.Handler[order]
	id string
}

// sharedRound runs calls as deliveries whose claims all queue, in order,
// behind a claim statement that waits on a row another transaction holds
// (key "x", handled by h), then lets that statement go: calls[i]'s claim is
// queued i-th, so the next round holds them all (each key once). It
// returns the deliveries' errors.
func sharedRound(t *testing.T, b *testBundle, tr *sqlTracer, h inboxtype.Handler[order], calls []claimCall) []error {
	t.Helper()
	ctx := t.Context()
	blocker, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(ctx) }()
	_, err = blocker.Exec(ctx, `INSERT INTO inboxmq_inbox (consumer, key, status) VALUES ('pay', 'order:x', 'failed')`)
	require.NoError(t, err)
	before := len(tr.matching("'processing'"))
	xDone := make(chan error, 1)
	go func() { xDone <- h.Handle(ctx, newMsg(t, "pay", order{OrderID: "x", Amount: 1}, false)) }()
	testenv.WaitFor(t, "the first claim sent", func() bool { return len(tr.matching("'processing'")) > before })

	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	for i, c := range calls {
		wg.Go(func() { errs[i] = c.h.Handle(ctx, newMsg(t, "pay", order{OrderID: c.id, Amount: 1}, false)) })
		testenv.WaitFor(t, "queued in order", func() bool { return inbox.LeasesQueued(b.store) == i+1 })
	}
	require.NoError(t, blocker.Commit(ctx))
	require.NoError(t, testenv.WaitChan(t, xDone, "the first delivery"))
	wg.Wait()
	return errs
}

// sharedClaimSQL identifies the shared claim statement.
const sharedClaimSQL = `unnest($1::text[], $2::text[], $3::text[], $4::bigint[]`

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
	b := setupOn(t, tracedPool(t, tr), nil)
	async := completingClaimHandler(b, nil, nil)
	durable := completingClaimHandler(b, nil, &inbox.ClaimOpts{DurableClaim: true})

	// A key that is already done.
	require.NoError(t, async.Handle(ctx, newMsg(t, "pay", order{OrderID: "done", Amount: 1}, false)))
	errs := sharedRound(t, b, tr, async, []claimCall{{async, "y1"}, {async, "y2"}, {async, "y1"}, {async, "done"}, {durable, "z"}})

	rounds := tr.matching(sharedClaimSQL)
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

// A shared claim statement that fails fails every claim of its round
// alike: each delivery is retried, no claim of the round is left behind,
// and the retries complete each job once.
func TestClaim_FailedSharedClaimFailsItsRoundAndLeavesNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tr := &sqlTracer{}
	b := setupOn(t, tracedPool(t, tr), nil)
	h := completingClaimHandler(b, nil, nil)
	// A claim of key "order:boom" makes the whole statement fail.
	_, err := b.pool.Exec(ctx, `
		CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.key = 'order:boom' AND NEW.status = 'processing' THEN RAISE EXCEPTION 'boom'; END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER boom BEFORE INSERT ON inboxmq_inbox FOR EACH ROW EXECUTE FUNCTION boom();`)
	require.NoError(t, err)

	errs := sharedRound(t, b, tr, h, []claimCall{{h, "a"}, {h, "boom"}, {h, "b"}})
	require.Len(t, tr.matching(sharedClaimSQL), 1)
	for i, err := range errs {
		require.ErrorContains(t, err, "boom", "delivery %d", i)
		require.Equal(t, retry.KindRetry, retry.Classify(err).Kind, "delivery %d is retried", i)
	}
	require.Zero(t, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE key IN ('order:a', 'order:b', 'order:boom')`), "no claim left behind")
	require.Zero(t, b.count(t, `SELECT count(*) FROM effects WHERE key <> 'order:x'`))

	for _, id := range []string{"a", "b"} {
		require.NoError(t, h.Handle(ctx, newMsg(t, "pay", order{OrderID: id, Amount: 1}, false)), "the retry of %s", id)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = $1`, "order:"+id))
	}
}

// Many deliveries of few keys claimed concurrently through shared
// statements: each key's effect is written exactly once, and every
// delivery either completed it or was told it is a duplicate or held.
func TestClaim_SharedClaimsUnderConcurrencyOneEffectPerKey(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, nil)
	h := completingClaimHandler(b, nil, nil)
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
