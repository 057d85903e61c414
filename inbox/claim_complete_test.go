package inbox_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
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
	}, nil, nil)

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

// A result without business writes travels in the one completion
// statement: the claim and the completion are the delivery's two round
// trips, and a duplicate gets the stored result. A result PostgreSQL
// refuses (bytes that are not UTF-8) completes nothing and fails
// permanently, as when a statement of the handler's writes it.
func TestClaim_ResultWithoutWritesIsInTheCompletion(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tr := &countingTracer{}
	b := setupOn(t, tracedPool(t, tr), nil)
	h := inbox.ClaimHandler(b.store, func(_ context.Context, _ *inbox.Claim, msg *inboxtype.Message[order]) error {
		if msg.Body.OrderID == "latin1" {
			return msg.SetResult(json.RawMessage("{\"charge\":\"ch_\xe9\"}"))
		}
		return msg.SetResult(map[string]string{"charge": "ch_" + msg.Body.OrderID})
	}, nil, nil)

	before := tr.n.Load()
	require.NoError(t, h.Handle(ctx, newMsg(t, "pay", order{OrderID: "r", Amount: 1}, false)))
	require.Equal(t, int64(2), tr.n.Load()-before, "round trips: the claim, then the completion with its result")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE key = 'order:r' AND status = 'completed' AND result->>'charge' = 'ch_r'`))
	dup := newMsg(t, "pay", order{OrderID: "r", Amount: 1}, true)
	require.ErrorIs(t, h.Handle(ctx, dup), retry.ErrDuplicate)
	require.JSONEq(t, `{"charge":"ch_r"}`, string(dup.Result()))

	err := h.Handle(ctx, newMsg(t, "pay", order{OrderID: "latin1", Amount: 1}, false))
	d := retry.Classify(err)
	require.Equal(t, retry.KindPermanent, d.Kind, "%v", err)
	require.Equal(t, inbox.ReasonDBDataException, d.Reason)
	r := b.get(t, "pay", "order:latin1")
	require.NotEqual(t, inbox.RecordCompleted, r.Status, "nothing completed")
	require.Nil(t, r.Result)
}

// With business writes, a result set after them (the handler's answer,
// known once they ran) is written in COMMIT's round trip: the claim, BEGIN
// + completion + the first write, and the result with COMMIT — three round
// trips, not a fourth for the result.
func TestClaim_ResultWrittenInTheCommitsRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tr := &countingTracer{}
	b := setupOn(t, tracedPool(t, tr), nil)
	h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if err := completeWithEffect(msg)(ctx, tx); err != nil {
				return err
			}
			return msg.SetResult(map[string]string{"order": msg.Body.OrderID})
		})
	}, nil, nil)

	before := tr.n.Load()
	require.NoError(t, h.Handle(ctx, newMsg(t, "pay", order{OrderID: "w", Amount: 3}, false)))
	require.Equal(t, int64(3), tr.n.Load()-before, "round trips of one delivery")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE key = 'order:w' AND status = 'completed' AND result->>'order' = 'w'`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:w' AND amount = 3`))
}
