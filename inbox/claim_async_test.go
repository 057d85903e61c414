package inbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/retry"
)

// The claim is committed asynchronously, but the setting is the claim
// statement's alone: on the same pooled connection, the completion's
// transaction and every later statement run with the server's durable
// synchronous_commit again. (A leak would make business commits
// non-durable.)
func TestClaim_AsyncClaimDoesNotLeakToTheConnection(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.SchemaWith(t, 1) // one connection: the claim's is the completion's
	b := setupOn(t, pool, nil)
	show := func(ctx context.Context, q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	},
	) string {
		var v string
		require.NoError(t, q.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&v))
		return v
	}
	server := show(t.Context(), b.pool)
	require.NotEqual(t, "off", server, "the test needs a durable server setting")

	var afterClaim, inCompletion string
	h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		afterClaim = show(ctx, b.pool)
		return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO effects (key, amount) VALUES ($1, $2)`, msg.Key, msg.Body.Amount); err != nil {
				return err
			}
			inCompletion = show(ctx, tx)
			return nil
		})
	}, nil, nil)
	require.NoError(t, h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "a", Amount: 1}, false)))
	require.Equal(t, server, afterClaim)
	require.Equal(t, server, inCompletion)
	require.Equal(t, server, show(t.Context(), b.pool))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
}

// An asynchronously committed claim can be lost in a database crash. The
// worker's fenced completion then finds no row at all: that is not "another
// worker won", so the delivery is retried, never acked, and the retry
// completes the job once.
func TestClaim_LostClaimIsRetriedNotAcked(t *testing.T) {
	t.Parallel()
	for _, durable := range []bool{false, true} {
		b := setup(t, nil)
		opts := &inbox.ClaimOpts{DurableClaim: durable}
		h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
			// What a crash losing the claim's unflushed commit leaves behind.
			_, err := b.pool.Exec(ctx, `DELETE FROM inboxmq_inbox WHERE key = $1`, c.Key)
			require.NoError(t, err)
			return c.Complete(ctx, completeWithEffect(msg))
		}, nil, opts)
		err := h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "l", Amount: 1}, false))
		d := retry.Classify(err)
		require.Equal(t, retry.KindRetry, d.Kind, "durable %v: a lost claim is retried: %v", durable, err)
		require.Equal(t, inbox.ReasonLeaseLost, d.Reason)
		require.Equal(t, 0, b.count(t, `SELECT count(*) FROM effects`))

		ok := completingClaimHandler(b, nil, opts)
		require.NoError(t, ok.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "l", Amount: 1}, false)))
		require.ErrorIs(t, ok.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "l", Amount: 1}, false)), retry.ErrDuplicate)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
	}
}
