package inbox_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// batchEffects queues effectHandler's two writes and a result, counting
// its runs in calls (when set); the effect's id, read by a callback, goes
// to ids (when set).
func batchEffects(calls *atomic.Int64, ids chan<- int64) inbox.BatchHandlerFunc[order] {
	return func(_ context.Context, b *pgx.Batch, msg *inboxtype.Message[order]) error {
		if calls != nil {
			calls.Add(1)
		}
		q := b.Queue(`INSERT INTO effects (key, amount) VALUES ($1, $2) RETURNING id`, msg.Key, msg.Body.Amount)
		if ids != nil {
			q.QueryRow(func(row pgx.Row) error {
				var id int64
				if err := row.Scan(&id); err != nil {
					return err
				}
				ids <- id
				return nil
			})
		}
		b.Queue(`INSERT INTO ledger (key) VALUES ($1)`, msg.Key)
		return msg.SetResult(paymentResult{Order: msg.Body.OrderID})
	}
}

// A delivery whose key is free costs one round trip: the claim, the
// handler's writes and its result, committed together; its callbacks read
// what the writes returned.
func TestBatchHandler_OneRoundTripForAFreeKey(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tr := &countingTracer{}
	b := setupOn(t, tracedPool(t, tr), nil)
	ids := make(chan int64, 1)
	h := inbox.BatchHandler(b.store, batchEffects(nil, ids), nil)

	o := order{OrderID: "1", Amount: 7}
	msg := newMsg(t, "c", o, false)
	before := tr.n.Load()
	require.NoError(t, h.Handle(ctx, msg))
	require.Equal(t, int64(1), tr.n.Load()-before, "round trips of one delivery")

	id := <-ids
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE id = $1 AND key = $2 AND amount = 7`, id, o.IdempotencyKey()))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM ledger`))
	rec := b.get(t, "c", o.IdempotencyKey())
	require.Equal(t, inbox.RecordCompleted, rec.Status)
	require.Equal(t, "1", decodeResult(t, rec.Result).Order)
	require.Equal(t, int64(1), rec.Fence)
	require.Equal(t, int64(1), msg.Delivery.InboxFence, "the claim's fence is reported")
}

// A copy of a completed key is a duplicate with the first one's result,
// and a copy with another payload a key conflict; neither writes.
func TestBatchHandler_DuplicateAndConflictWriteNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, nil)
	var calls atomic.Int64
	h := inbox.BatchHandler(b.store, batchEffects(&calls, nil), nil)
	o := order{OrderID: "1", Amount: 5}
	require.NoError(t, h.Handle(ctx, newMsg(t, "c", o, false)))

	dup := newMsg(t, "c", o, true)
	err := h.Handle(ctx, dup)
	require.ErrorIs(t, err, retry.ErrDuplicate)
	require.Equal(t, retry.KindDuplicate, retry.Classify(err).Kind)
	require.Equal(t, "1", decodeResult(t, dup.Result()).Order, "the duplicate gets the stored result")

	err = h.Handle(ctx, newMsg(t, "c", order{OrderID: "1", Amount: 6}, false))
	require.ErrorIs(t, err, retry.ErrKeyConflict)
	require.Equal(t, retry.KindPermanent, retry.Classify(err).Kind)

	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`), "one effect")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM ledger`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE amount = 5`))
}

// Copies of one key handled at once: exactly one commits its writes, the
// others are duplicates.
func TestBatchHandler_OneEffectUnderConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := inbox.BatchHandler(b.store, batchEffects(nil, nil), nil)
	const keys, copies = 10, 4
	var ok, dups atomic.Int64
	var wg sync.WaitGroup
	for k := range keys {
		o := order{OrderID: strconv.Itoa(k), Amount: k + 1}
		for range copies {
			wg.Go(func() {
				err := h.Handle(t.Context(), newMsg(t, "c", o, false))
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, retry.ErrDuplicate):
					dups.Add(1)
				default:
					t.Errorf("key %d: %v", k, err)
				}
			})
		}
	}
	wg.Wait()
	require.Equal(t, int64(keys), ok.Load(), "one success per key")
	require.Equal(t, int64(keys*(copies-1)), dups.Load())
	require.Equal(t, keys, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, keys, b.count(t, `SELECT count(DISTINCT key) FROM effects`))
	require.Equal(t, keys, b.count(t, `SELECT count(*) FROM ledger`))
}

// A write PostgreSQL refuses rolls back the claim and every write before
// it; the failure is recorded on the row as Handler records it, and the
// key is taken up again by the next copy.
func TestBatchHandler_FailedWriteRollsBackAndIsRecorded(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, nil)
	var fail atomic.Bool
	fail.Store(true)
	h := inbox.BatchHandler(b.store, func(ctx context.Context, bt *pgx.Batch, msg *inboxtype.Message[order]) error {
		bt.Queue(`INSERT INTO effects (key, amount) VALUES ($1, $2)`, msg.Key, msg.Body.Amount)
		if fail.Load() {
			bt.Queue(`SELECT 1/0`)
		}
		return nil
	}, nil)
	o := order{OrderID: "1", Amount: 5}

	err := h.Handle(ctx, newMsg(t, "c", o, false))
	require.Error(t, err)
	require.Equal(t, retry.KindPermanent, retry.Classify(err).Kind, "a data error is permanent: %v", err)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM effects`), "the first write rolled back")
	rec := b.get(t, "c", o.IdempotencyKey())
	require.Equal(t, inbox.RecordFailed, rec.Status)
	require.NotNil(t, rec.LastError)
	require.Contains(t, *rec.LastError, "division by zero")

	fail.Store(false)
	require.NoError(t, h.Handle(ctx, newMsg(t, "c", o, true)))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, inbox.RecordCompleted, b.get(t, "c", o.IdempotencyKey()).Status)
}

// The handler's own error and its panic send nothing and are recorded;
// a duplicate's handler failing does not hide that it is a duplicate.
func TestBatchHandler_HandlerErrorAndPanic(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, nil)
	errBoom := errors.New("boom")
	h := inbox.BatchHandler(b.store, func(_ context.Context, bt *pgx.Batch, msg *inboxtype.Message[order]) error {
		switch msg.Body.OrderID {
		case "err":
			return retry.Retryable(errBoom)
		case "panic":
			panic("kaboom")
		}
		bt.Queue(`INSERT INTO effects (key, amount) VALUES ($1, $2)`, msg.Key, msg.Body.Amount)
		return nil
	}, nil)

	err := h.Handle(ctx, newMsg(t, "c", order{OrderID: "err"}, false))
	require.ErrorIs(t, err, errBoom)
	require.Equal(t, retry.KindRetry, retry.Classify(err).Kind)
	require.Equal(t, inbox.RecordFailed, b.get(t, "c", "order:err").Status)

	err = h.Handle(ctx, newMsg(t, "c", order{OrderID: "panic"}, false))
	require.Equal(t, retry.ReasonPanic, retry.Classify(err).Reason, "%v", err)
	require.Equal(t, inbox.RecordFailed, b.get(t, "c", "order:panic").Status)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM effects`))
}

// In a group commit the batch goes into the delivery's savepoint: every
// delivery commits once with its result.
func TestBatchHandler_GroupCommit(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var calls atomic.Int64
	h := inbox.BatchHandler(b.store, batchEffects(&calls, nil), fullBatch(8))
	msgs := orders(t, 8)
	for i, err := range handleAll(t, h, msgs) {
		require.NoError(t, err, "delivery %d", i)
	}
	for _, m := range msgs {
		require.Equal(t, m.Body.OrderID, decodeResult(t, b.get(t, "payments", m.Key).Result).Order)
	}
	require.Equal(t, int64(8), calls.Load(), "each handler ran once")
	require.Equal(t, 8, b.count(t, `SELECT count(*) FROM effects`), "one effect per key")
	require.Equal(t, 8, b.count(t, `SELECT count(*) FROM ledger`))
}

// A group of deliveries with free keys costs one round trip in all: every
// claim with its result, and every write, committed together; each
// delivery's fence is reported.
func TestBatchHandler_GroupOfFreeKeysIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	tr := &countingTracer{}
	b := setupOn(t, tracedPool(t, tr), nil)
	h := inbox.BatchHandler(b.store, batchEffects(nil, nil), fullBatch(8))
	msgs := orders(t, 8)
	before := tr.n.Load()
	for i, err := range handleAll(t, h, msgs) {
		require.NoError(t, err, "delivery %d", i)
	}
	require.Equal(t, int64(1), tr.n.Load()-before, "round trips of the group")
	for _, m := range msgs {
		rec := b.get(t, "payments", m.Key)
		require.Equal(t, inbox.RecordCompleted, rec.Status)
		require.Equal(t, m.Body.OrderID, decodeResult(t, rec.Result).Order)
		require.Equal(t, m.Body.OrderID, decodeResult(t, m.Result()).Order)
		require.Equal(t, rec.Fence, m.Delivery.InboxFence, "the claim's fence is reported")
	}
	require.Equal(t, 8, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, 8, b.count(t, `SELECT count(*) FROM ledger`))
}

// A group's claim reports each delivery's own fence: keys taken up again
// after a failed attempt have a higher one, whatever the keys' order in the
// database's collation.
func TestBatchHandler_GroupReportsEachFence(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ids := []string{"a", "B", "c", "D"}
	fail := map[string]bool{"B": true, "D": true}
	// Failed in a group's transaction, a row keeps its claim's fence, so
	// the next claim's is one higher.
	failing := inbox.BatchHandler(b.store, func(context.Context, *pgx.Batch, *inboxtype.Message[order]) error {
		return retry.Retryable(errors.New("not yet"))
	}, fullBatch(len(fail)))
	var first []*inboxtype.Message[order]
	for id := range fail {
		first = append(first, newMsg(t, "payments", order{OrderID: id, Amount: 1}, false))
	}
	for _, err := range handleAll(t, failing, first) {
		require.Error(t, err)
	}
	h := inbox.BatchHandler(b.store, batchEffects(nil, nil), fullBatch(len(ids)))
	msgs := make([]*inboxtype.Message[order], len(ids))
	for i, id := range ids {
		msgs[i] = newMsg(t, "payments", order{OrderID: id, Amount: 1}, true)
	}
	for i, err := range handleAll(t, h, msgs) {
		require.NoError(t, err, "delivery %d", i)
	}
	for _, m := range msgs {
		want := int64(1)
		if fail[m.Body.OrderID] {
			want = 2
		}
		require.Equal(t, want, b.get(t, "payments", m.Key).Fence, m.Key)
		require.Equal(t, want, m.Delivery.InboxFence, m.Key)
	}
}

// One delivery of a group that cannot commit — its key completed, or a
// write PostgreSQL refuses — aborts the group's round trip as a whole; the
// group then runs with savepoints, and only that delivery gets its verdict
// while the others commit once.
func TestBatchHandler_GroupFallsBackWhole(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, nil)
	var calls atomic.Int64
	effects := batchEffects(&calls, nil)
	h := inbox.BatchHandler(b.store, func(ctx context.Context, bt *pgx.Batch, msg *inboxtype.Message[order]) error {
		if err := effects(ctx, bt, msg); err != nil {
			return err
		}
		if msg.Body.OrderID == "bad" {
			bt.Queue(`SELECT 1/0`)
		}
		return nil
	}, fullBatch(4))
	done := newMsg(t, "payments", order{OrderID: "done", Amount: 1}, false)
	require.NoError(t, inbox.BatchHandler(b.store, effects, nil).Handle(ctx, done))

	msgs := []*inboxtype.Message[order]{
		newMsg(t, "payments", order{OrderID: "a", Amount: 2}, false),
		newMsg(t, "payments", order{OrderID: "done", Amount: 1}, true),
		newMsg(t, "payments", order{OrderID: "bad", Amount: 3}, false),
		newMsg(t, "payments", order{OrderID: "b", Amount: 4}, false),
	}
	errs := handleAll(t, h, msgs)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], retry.ErrDuplicate)
	require.Equal(t, "done", decodeResult(t, msgs[1].Result()).Order, "the duplicate gets the stored result")
	require.ErrorContains(t, errs[2], "division by zero")
	require.Equal(t, retry.KindPermanent, retry.Classify(errs[2]).Kind)
	require.NoError(t, errs[3])

	require.Equal(t, inbox.RecordFailed, b.get(t, "payments", "order:bad").Status)
	for _, k := range []string{"order:a", "order:b", "order:done"} {
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = $1`, k), k)
		require.Equal(t, inbox.RecordCompleted, b.get(t, "payments", k).Status, k)
	}
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:bad'`))
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM ledger`))
}

// A key taken up again after a failed attempt gets the result of the
// attempt that completes it, written by its claim.
func TestBatchHandler_RetriedKeyStoresItsResult(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, nil)
	var fail atomic.Bool
	fail.Store(true)
	h := inbox.BatchHandler(b.store, func(_ context.Context, bt *pgx.Batch, msg *inboxtype.Message[order]) error {
		if fail.Load() {
			return retry.Retryable(errors.New("not yet"))
		}
		bt.Queue(`INSERT INTO effects (key, amount) VALUES ($1, $2)`, msg.Key, msg.Body.Amount)
		return msg.SetResult(paymentResult{Order: msg.Body.OrderID})
	}, nil)
	o := order{OrderID: "7", Amount: 7}
	require.Error(t, h.Handle(ctx, newMsg(t, "c", o, false)))
	require.Equal(t, inbox.RecordFailed, b.get(t, "c", o.IdempotencyKey()).Status)

	fail.Store(false)
	require.NoError(t, h.Handle(ctx, newMsg(t, "c", o, true)))
	rec := b.get(t, "c", o.IdempotencyKey())
	require.Equal(t, inbox.RecordCompleted, rec.Status)
	require.Equal(t, "7", decodeResult(t, rec.Result).Order)
}

// The round trip's answer lost after PostgreSQL committed it: the
// per-message path finds the key completed, so the delivery is a duplicate
// of itself, with its result, and the writes are there once.
func TestBatchHandler_CommitAnswerLostIsADuplicate(t *testing.T) {
	t.Parallel()
	d := newCommitDropper(t)
	d.match = []byte("order:lost") // the key, in the batch's Bind
	_, schema := pgtest.SchemaWith(t, 1)
	b := setupOn(t, d.pool(t, schema), nil)
	h := inbox.BatchHandler(b.store, batchEffects(nil, nil), nil)
	require.NoError(t, h.Handle(t.Context(), newMsg(t, "c", order{OrderID: "warm", Amount: 1}, false)))

	d.armed.Store(true)
	msg := newMsg(t, "c", order{OrderID: "lost", Amount: 5}, false)
	err := h.Handle(t.Context(), msg)
	testenv.WaitChan(t, d.fired, "the batch answered and dropped")
	require.ErrorIs(t, err, retry.ErrDuplicate)
	require.Equal(t, "lost", decodeResult(t, msg.Result()).Order)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:lost'`), "one effect")
	require.Equal(t, inbox.RecordCompleted, b.get(t, "c", "order:lost").Status)
}

// A group's round trip answered and lost after PostgreSQL committed it:
// the group runs again, finds every key completed, and each delivery is a
// duplicate of itself, with its own result; every effect is there once.
func TestBatchHandler_GroupCommitAnswerLostIsADuplicate(t *testing.T) {
	t.Parallel()
	d := newCommitDropper(t)
	d.match = []byte("order:lost-2") // a key, in the group claim's Bind
	_, schema := pgtest.SchemaWith(t, 1)
	b := setupOn(t, d.pool(t, schema), nil)
	warm := newMsg(t, "c", order{OrderID: "warm", Amount: 1}, false)
	require.NoError(t, inbox.BatchHandler(b.store, batchEffects(nil, nil), nil).Handle(t.Context(), warm))
	h := inbox.BatchHandler(b.store, batchEffects(nil, nil), fullBatch(3))

	d.armed.Store(true)
	msgs := make([]*inboxtype.Message[order], 3)
	for i := range msgs {
		msgs[i] = newMsg(t, "c", order{OrderID: "lost-" + strconv.Itoa(i+1), Amount: i + 1}, false)
	}
	errs := handleAll(t, h, msgs)
	testenv.WaitChan(t, d.fired, "the group's batch answered and dropped")
	for i, m := range msgs {
		require.ErrorIs(t, errs[i], retry.ErrDuplicate, m.Key)
		require.Equal(t, m.Body.OrderID, decodeResult(t, m.Result()).Order, m.Key)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = $1`, m.Key), "one effect for %s", m.Key)
		require.Equal(t, inbox.RecordCompleted, b.get(t, "c", m.Key).Status)
	}
}

// A result set from a callback, after the batch was sent, is not stored:
// the delivery keeps the result stored with its writes, the one its
// duplicates get back.
func TestBatchHandler_ResultFromACallbackIsNotStored(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, nil)
	h := inbox.BatchHandler(b.store, func(_ context.Context, bt *pgx.Batch, msg *inboxtype.Message[order]) error {
		bt.Queue(`INSERT INTO effects (key, amount) VALUES ($1, $2) RETURNING id`, msg.Key, msg.Body.Amount).
			QueryRow(func(row pgx.Row) error {
				var id int64
				if err := row.Scan(&id); err != nil {
					return err
				}
				return msg.SetResult(paymentResult{PaymentID: id, Order: "late"})
			})
		return msg.SetResult(paymentResult{Order: msg.Body.OrderID})
	}, nil)
	o := order{OrderID: "1", Amount: 3}
	first := newMsg(t, "c", o, false)
	require.NoError(t, h.Handle(ctx, first))
	require.Equal(t, "1", decodeResult(t, first.Result()).Order, "the delivery keeps the stored result")
	require.Equal(t, "1", decodeResult(t, b.get(t, "c", o.IdempotencyKey()).Result).Order)

	dup := newMsg(t, "c", o, true)
	require.ErrorIs(t, h.Handle(ctx, dup), retry.ErrDuplicate)
	require.Equal(t, decodeResult(t, first.Result()), decodeResult(t, dup.Result()), "the first delivery and its duplicate carry the same result")
}
