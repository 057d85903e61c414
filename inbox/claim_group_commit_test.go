package inbox_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// fullClaimBatch is fullBatch for claim mode: the completions of exactly
// n deliveries share a transaction (the long MaxWait is never reached in
// a passing test).
func fullClaimBatch(n int) *inbox.GroupCommit {
	return &inbox.GroupCommit{MaxBatch: n, MaxWait: time.Minute, MaxInFlight: 1}
}

// completeThen is a claim handler whose completion writes the effect row,
// then runs then(ctx, tx, msg), whose error it returns.
func completeThen(b *testBundle, gc *inbox.GroupCommit, then func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error) inboxtype.Handler[order] {
	return inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if err := completeWithEffect(msg)(ctx, tx); err != nil {
				return err
			}
			return then(ctx, tx, msg)
		})
	}, gc, nil)
}

func TestClaimGroupCommit_CompletionsShareOneTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var mu sync.Mutex
	txids := map[int64]int{}
	h := completeThen(b, fullClaimBatch(5), func(ctx context.Context, tx pgx.Tx, _ *inboxtype.Message[order]) error {
		var txid int64
		if err := tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&txid); err != nil {
			return err
		}
		mu.Lock()
		txids[txid]++
		mu.Unlock()
		return nil
	})

	for _, err := range handleAll(t, h, orders(t, 5)) {
		require.NoError(t, err)
	}
	require.Len(t, txids, 1, "the five completions share one transaction")
	require.Equal(t, 5, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, 5, b.count(t, `SELECT count(*) FROM inboxmq_inbox
		WHERE status = 'completed' AND owner IS NULL AND lease_until IS NULL AND attempts = 1`))
}

func TestClaimGroupCommit_FailureInTheMiddleReleasesOnlyItsClaim(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := completeThen(b, fullClaimBatch(5), func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if msg.Body.OrderID == "3" {
			// A failed statement aborts the transaction: only its
			// savepoint brings the batch back.
			_, err := tx.Exec(ctx, `SELECT 1/0`)
			return err
		}
		return nil
	})

	errs := handleAll(t, h, orders(t, 5))
	for i, err := range errs {
		if i == 2 {
			require.ErrorContains(t, err, "division by zero")
			requirePermanent(t, err, inbox.ReasonDBDataException)
			continue
		}
		require.NoError(t, err)
	}
	require.Equal(t, 4, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:3'`))
	r := b.get(t, "payments", "order:3")
	require.Equal(t, inbox.RecordFailed, r.Status, "the failed completion released its claim")
	require.Nil(t, r.Owner)
	require.Nil(t, r.CompletedAt)
	require.Contains(t, *r.LastError, "division by zero")
	require.Equal(t, inbox.RecordCompleted, b.get(t, "payments", "order:4").Status)

	// A replay takes the released claim and completes once.
	replayed := newMsg(t, "payments", order{OrderID: "3", Amount: 2}, false)
	replayed.Attempt = 2
	require.NoError(t, completingClaimHandler(b, nil, nil).Handle(t.Context(), replayed))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:3'`))
	r = b.get(t, "payments", "order:3")
	require.Equal(t, inbox.RecordCompleted, r.Status)
	require.Equal(t, 2, r.Attempts)
}

// A claim taken over between its claim and its completion is fenced out of
// the batch alone: a duplicate if the new owner completed, a deferred retry
// if it has not; the batch's other completions commit.
func TestClaimGroupCommit_TakenOverClaimIsFencedOutAlone(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		var takeOver string
		switch msg.Body.OrderID {
		case "1": // another worker took the claim over and completed
			takeOver = `UPDATE inboxmq_inbox SET status = 'completed', owner = NULL, lease_until = NULL,
				fence = fence + 1, completed_at = now() WHERE key = $1`
		case "2": // another worker took it over and is still working
			takeOver = `UPDATE inboxmq_inbox SET owner = 'another worker', fence = fence + 1 WHERE key = $1`
		}
		if takeOver != "" {
			if _, err := b.pool.Exec(ctx, takeOver, c.Key); err != nil {
				return err
			}
		}
		return c.Complete(ctx, completeWithEffect(msg))
	}, fullClaimBatch(3), nil)

	errs := handleAll(t, h, orders(t, 3))
	require.ErrorIs(t, errs[0], retry.ErrDuplicate)
	require.Equal(t, retry.SourceFenced, retry.Classify(errs[0]).Source)
	d := retry.Classify(errs[1])
	require.Equal(t, retry.KindRetry, d.Kind, "%v", errs[1])
	require.Equal(t, inbox.ReasonClaimHeld, d.Reason)
	require.NoError(t, errs[2])

	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:3'`))
	r := b.get(t, "payments", "order:2")
	require.Equal(t, inbox.RecordProcessing, r.Status, "the new owner's claim is untouched")
	require.Equal(t, "another worker", *r.Owner)
}

// A completion whose writes fail only at COMMIT fails the batch's commit;
// the completions then run again one by one, so only that one fails (its
// claim released; a foreign key violation is permanent) and the others
// commit once.
func TestClaimGroupCommit_CommitFailureFailsOnlyItsCompletion(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := completeThen(b, fullClaimBatch(4), func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if msg.Body.OrderID == "2" {
			// A deferred foreign key: the statement succeeds, COMMIT fails.
			_, err := tx.Exec(ctx, `INSERT INTO child (id) VALUES (42)`)
			return err
		}
		return nil
	})

	requireOnlyPermanent(t, handleAll(t, h, orders(t, 4)), 1, inbox.ReasonDBIntegrityViolation)
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:2'`))
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE status = 'completed'`))
	r := b.get(t, "payments", "order:2")
	require.Equal(t, inbox.RecordFailed, r.Status, "its claim is released for the retry")
	require.Nil(t, r.Owner)
}

// Two workers (two stores on one database) whose claims and group-committed
// completions cover the same keys in opposite orders: no deadlock, every
// key completed once; a delivery that met the other worker's live claim is
// deferred, and its retry is a duplicate.
func TestClaimGroupCommit_TwoWorkersSameKeysOppositeOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	other, err := inbox.NewStore(b.pool, nil)
	if err == nil {
		err = other.Check(t.Context())
	}
	require.NoError(t, err)
	const n = 24
	var calls atomic.Int64
	handler := func(s *inbox.Store) inboxtype.Handler[order] {
		return inbox.ClaimHandler(s, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
			return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error { return effectHandler(&calls)(ctx, tx, msg) })
		}, &inbox.GroupCommit{MaxBatch: n, MaxWait: 20 * time.Millisecond, MaxInFlight: 2}, nil)
	}
	h1, h2 := handler(b.store), handler(other)

	var deferred []*inboxtype.Message[order]
	for round := range 3 {
		msgs := make([]*inboxtype.Message[order], 2*n)
		errs := make([]error, 2*n)
		var wg sync.WaitGroup
		for i := range n {
			msgs[i] = newMsg(t, "payments", order{OrderID: strconv.Itoa(round*n + i)}, false)
			msgs[n+i] = newMsg(t, "payments", order{OrderID: strconv.Itoa(round*n + n - 1 - i)}, false)
			wg.Go(func() { errs[i] = h1.Handle(t.Context(), msgs[i]) })
			wg.Go(func() { errs[n+i] = h2.Handle(t.Context(), msgs[n+i]) })
		}
		wg.Wait()
		for i, err := range errs {
			if err == nil || errors.Is(err, retry.ErrDuplicate) {
				continue
			}
			require.Equal(t, inbox.ReasonClaimHeld, retry.Classify(err).Reason, "%v", err)
			deferred = append(deferred, msgs[i])
		}
	}
	for _, m := range deferred {
		require.ErrorIs(t, h1.Handle(t.Context(), m), retry.ErrDuplicate, "key %s", m.Key)
	}
	require.Equal(t, int64(3*n), calls.Load(), "each key's callback ran once")
	require.Equal(t, 3*n, b.count(t, `SELECT count(DISTINCT key) FROM effects`))
	require.Equal(t, 3*n, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, 3*n, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE status = 'completed'`))
}

// A completion that finds no other in its batch takes claim mode's own
// path, so at low load group commit costs no round trip more than
// per-message claim mode: the claim; BEGIN, the fenced completion and the
// first insert; the second insert; COMMIT.
func TestClaimGroupCommit_LoneCompletionCostsWhatPerMessageModeCosts(t *testing.T) {
	t.Parallel()
	tr := &countingTracer{}
	b := setupOn(t, tracedPool(t, tr), nil)
	roundTrips := func(gc *inbox.GroupCommit, id string) int64 {
		h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
			return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error { return effectHandler(nil)(ctx, tx, msg) })
		}, gc, nil)
		before := tr.n.Load()
		require.NoError(t, h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: id}, false)))
		return tr.n.Load() - before
	}
	require.Equal(t, int64(4), roundTrips(nil, "per-message"))
	require.Equal(t, int64(4), roundTrips(&inbox.GroupCommit{MaxWait: time.Millisecond}, "grouped"))
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM effects`))
}
