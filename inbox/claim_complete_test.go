package inbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// completeSQL identifies claim mode's fenced completion of one claim.
var completeSQL = []string{"SET status = 'completed', owner = NULL", "result = COALESCE"}

// A claim completed with neither business writes nor a result is one
// autocommit statement, not BEGIN + completion and COMMIT. Fenced as ever:
// a claim taken over meanwhile completes nothing, and the delivery waits
// for the other owner (claim_held) rather than being acked.
func TestClaim_CompleteWithoutWritesIsOneStatement(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tr := &sqlTracer{}
	b := setupOn(t, tracedPool(t, tr), nil)
	h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		if msg.Body.OrderID == "taken" {
			if _, err := b.pool.Exec(ctx, `UPDATE inboxmq_inbox SET owner = 'another-worker', fence = fence + 1 WHERE key = $1`, c.Key); err != nil {
				return err
			}
		}
		return nil // the outside call succeeded; nothing to write here
	}, nil)

	require.NoError(t, h.Handle(ctx, newMsg(t, "pay", order{OrderID: "done", Amount: 1}, false)))
	// A batch (BEGIN + completion) is not seen by a query tracer; a
	// statement of its own is.
	require.Len(t, tr.matching(completeSQL...), 1, "the completion is a statement of its own")
	r := b.get(t, "pay", "order:done")
	require.Equal(t, inbox.RecordCompleted, r.Status)
	require.Nil(t, r.Owner)
	require.Nil(t, r.LeaseUntil)
	require.NotNil(t, r.CompletedAt)
	require.ErrorIs(t, h.Handle(ctx, newMsg(t, "pay", order{OrderID: "done", Amount: 1}, true)), retry.ErrDuplicate)

	err := h.Handle(ctx, newMsg(t, "pay", order{OrderID: "taken", Amount: 1}, false))
	d := retry.Classify(err)
	require.Equal(t, retry.KindRetry, d.Kind, "%v", err)
	require.Equal(t, inbox.ReasonClaimHeld, d.Reason)
	r = b.get(t, "pay", "order:taken")
	require.Equal(t, inbox.RecordProcessing, r.Status, "the other owner's claim is left alone")
	require.Equal(t, "another-worker", *r.Owner)
}

// With a result or business writes, the completion keeps its transaction:
// the result and the writes commit with it.
func TestClaim_CompleteWithAResultKeepsItsTransaction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tr := &sqlTracer{}
	b := setupOn(t, tracedPool(t, tr), nil)
	h := inbox.ClaimHandler(b.store, func(_ context.Context, _ *inbox.Claim, msg *inboxtype.Message[order]) error {
		return msg.SetResult(map[string]string{"charge": "ch_1"})
	}, nil)
	require.NoError(t, h.Handle(ctx, newMsg(t, "pay", order{OrderID: "r", Amount: 1}, false)))
	require.Empty(t, tr.matching(completeSQL...), "the completion went in the transaction's pipeline")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE key = 'order:r' AND status = 'completed' AND result->>'charge' = 'ch_1'`))
}
