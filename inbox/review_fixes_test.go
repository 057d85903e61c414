package inbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// A claim released by the reconciler (its worker stalled past the lease)
// is not "taken over by a winner": the stalled worker's completion must be
// retried, not acked as a duplicate — nobody committed the effect.
func TestClaim_ReleasedClaimIsRetriedNotAcked(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	rec, err := inbox.NewReconciler(b.store, nil)
	require.NoError(t, err)
	h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		// The worker stalls past its lease; the reconciler releases the claim.
		_, err := b.pool.Exec(ctx, `UPDATE inboxmq_inbox SET lease_until = now() - interval '1 hour'`)
		require.NoError(t, err)
		rep, err := rec.RunOnce(ctx, false)
		require.NoError(t, err)
		require.Equal(t, 1, rep.Released)
		return c.Complete(ctx, completeWithEffect(msg))
	}, nil, nil)
	err = h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "r", Amount: 1}, false))
	d := retry.Classify(err)
	require.Equal(t, retry.KindRetry, d.Kind, "a lost claim is retried: %v", err)
	require.Equal(t, inbox.ReasonLeaseLost, d.Reason)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM effects`))

	// The retry claims again and completes once.
	ok := completingClaimHandler(b, nil, nil)
	require.NoError(t, ok.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "r", Amount: 1}, false)))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
}

// A group-commit handler cannot commit the batch's transaction (that would
// commit the other deliveries' claims before their handlers ran).
func TestGroupCommit_HandlerCannotCommitTheBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var mu sync.Mutex
	commitErrs := map[string]error{}
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if err := effectHandler(nil)(ctx, tx, msg); err != nil {
			return err
		}
		if msg.Body.OrderID == "1" {
			err := tx.Commit(ctx)
			mu.Lock()
			commitErrs[msg.Key] = err
			mu.Unlock()
			return err
		}
		return nil
	}, fullBatch(3))
	errs := handleAll(t, h, orders(t, 3))
	require.Error(t, errs[0])
	require.NoError(t, errs[1])
	require.NoError(t, errs[2])
	require.Error(t, commitErrs["order:1"])
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:1'`))
	require.Equal(t, inbox.RecordFailed, b.get(t, "payments", "order:1").Status)
	require.False(t, errors.Is(errs[0], retry.ErrDuplicate))
}

// A handler whose first statement fails before its savepoint exists (a
// parse error: unknown table) fails alone; the rest of its batch commits.
func TestGroupCommit_ParseErrorFailsOnlyItsDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if msg.Body.OrderID == "2" {
			_, err := tx.Exec(ctx, `INSERT INTO no_such_table (x) VALUES (1)`)
			return err
		}
		return effectHandler(nil)(ctx, tx, msg)
	}, fullBatch(3))
	errs := handleAll(t, h, orders(t, 3))
	require.NoError(t, errs[0])
	require.ErrorContains(t, errs[1], "no_such_table")
	require.NoError(t, errs[2])
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, inbox.RecordFailed, b.get(t, "payments", "order:2").Status)
}
