package inbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// deadLettered reports to obs that the consumer dead-lettered msg's
// delivery at attempt with err's decision.
func deadLettered(obs inboxtype.Observer, msg *inboxtype.Message[order], attempt int, err error) {
	msg.Delivery.Attempt = attempt
	obs.OnOutcome(msg.Delivery, inboxtype.Outcome{Decision: retry.Classify(err), Action: inboxtype.ActionDeadLettered})
}

// A dead-lettered key's row becomes dead, with the dead letter's reason and
// error text and its attempt; other outcomes, completed rows and live
// claims are left alone; a replay takes the dead key up again.
func TestDeadLetterObserver_MarksTheRowDead(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	obs := b.store.DeadLetterObserver()
	var down atomic.Bool
	down.Store(true)
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if down.Load() {
			return retry.Permanent(errors.New("card declined"))
		}
		return effectHandler(nil)(ctx, tx, msg)
	}, nil)

	msg := newMsg(t, "payments", order{OrderID: "x"}, false)
	err := h.Handle(t.Context(), msg)
	require.Error(t, err)
	require.Equal(t, inbox.RecordFailed, b.get(t, "payments", "order:x").Status)

	// Outcomes other than a settled dead letter change nothing.
	for _, out := range []inboxtype.Outcome{
		{Decision: retry.Classify(err), Action: inboxtype.ActionRetried},
		{Decision: retry.Classify(err), Action: inboxtype.ActionRequeued},
		{Decision: retry.Classify(err), Action: inboxtype.ActionDeadLettered, Err: errors.New("ack failed")},
	} {
		obs.OnOutcome(msg.Delivery, out)
		require.Equal(t, inbox.RecordFailed, b.get(t, "payments", "order:x").Status, "%+v", out)
	}

	deadLettered(obs, msg, 4, err)
	r := b.get(t, "payments", "order:x")
	require.Equal(t, inbox.RecordDead, r.Status)
	require.Equal(t, "permanent: card declined", *r.LastError, "the dead letter's x-error text")
	require.Equal(t, 4, r.Attempts, "the dead letter's x-attempt")

	// The replay (attempt 1 again) takes the dead key up and completes it.
	down.Store(false)
	require.NoError(t, h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "x"}, false)))
	r = b.get(t, "payments", "order:x")
	require.Equal(t, inbox.RecordCompleted, r.Status)
	require.Equal(t, 1, r.Attempts)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:x'`))

	// A completed row stays completed (a late dead letter of a copy).
	deadLettered(obs, newMsg(t, "payments", order{OrderID: "x"}, false), 2, retry.Permanent(errors.New("late copy")))
	require.Equal(t, inbox.RecordCompleted, b.get(t, "payments", "order:x").Status)

	// A live claim stays its owner's.
	_, err = b.pool.Exec(t.Context(), `INSERT INTO inboxmq_inbox (consumer, key, status, owner, fence, lease_until, attempts)
		VALUES ('payments', 'order:busy', 'processing', 'owner', 1, now() + interval '1 hour', 1)`)
	require.NoError(t, err)
	deadLettered(obs, newMsg(t, "payments", order{OrderID: "busy"}, false), 1, retry.Permanent(errors.New("copy")))
	require.Equal(t, inbox.RecordProcessing, b.get(t, "payments", "order:busy").Status)

	// A key without a row gets none.
	deadLettered(obs, newMsg(t, "payments", order{OrderID: "never"}, false), 1, retry.Permanent(errors.New("decode")))
	_, err = b.store.Get(t.Context(), "payments", "order:never")
	require.ErrorIs(t, err, inbox.ErrNotFound)
}

// Marking a row dead does not loosen the crash-loop bound: the counter
// starts again after a dead row (a replay is a new life), and a copy of the
// key that then crashes the worker every time is stopped after CrashLimit
// redeliveries, as on a fresh row.
func TestDeadLetterObserver_CrashLoopBoundHolds(t *testing.T) {
	t.Parallel()
	const limit = 3
	b := setup(t, &inbox.StoreConfig{CrashLimit: limit})
	var calls atomic.Int64
	h := inbox.Handler(b.store, func(context.Context, pgx.Tx, *inboxtype.Message[order]) error {
		calls.Add(1)
		return errors.New("worker would have crashed here")
	}, nil)
	first := newMsg(t, "payments", order{OrderID: "c"}, false)
	err := h.Handle(t.Context(), first)
	require.Error(t, err)
	deadLettered(b.store.DeadLetterObserver(), first, 1, err)
	require.Equal(t, inbox.RecordDead, b.get(t, "payments", "order:c").Status)

	calls.Store(0)
	var last error
	for i := range limit + 2 {
		last = h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "c"}, true))
		if retry.Classify(last).Reason == inbox.ReasonCrashLoop {
			require.Equal(t, limit, i, "stopped after %d redeliveries", limit)
			break
		}
	}
	requirePermanent(t, last, inbox.ReasonCrashLoop)
	require.Equal(t, int64(limit), calls.Load(), "the handler ran at most CrashLimit times")
	require.Equal(t, inbox.RecordDead, b.get(t, "payments", "order:c").Status)
	require.Equal(t, limit+1, b.get(t, "payments", "order:c").Deliveries)
}
