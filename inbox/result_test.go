package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// paymentResult is the result the tests' handlers store.
type paymentResult struct {
	PaymentID int64  `json:"payment_id"`
	Order     string `json:"order"`
}

// resultHandler writes one effect row and stores its id as the result.
func resultHandler() inbox.TxHandlerFunc[order] {
	return func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO effects (key, amount) VALUES ($1, $2) RETURNING id`,
			msg.Key, msg.Body.Amount).Scan(&id); err != nil {
			return err
		}
		return msg.SetResult(paymentResult{PaymentID: id, Order: msg.Body.OrderID})
	}
}

// decodeResult decodes a stored result.
func decodeResult(t *testing.T, raw json.RawMessage) paymentResult {
	t.Helper()
	require.NotNil(t, raw)
	var r paymentResult
	require.NoError(t, json.Unmarshal(raw, &r))
	return r
}

func TestResult_StoredWithTheEffectAndReplayedToDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := inbox.Handler(b.store, resultHandler(), nil)
	o := order{OrderID: "1", Amount: 10}

	first := newMsg(t, "c", o, false)
	require.NoError(t, h.Handle(t.Context(), first))
	rec := b.get(t, "c", o.IdempotencyKey())
	stored := decodeResult(t, rec.Result)
	require.Equal(t, o.OrderID, stored.Order)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE id = $1`, stored.PaymentID))

	for range 2 {
		dup := newMsg(t, "c", o, false)
		err := h.Handle(t.Context(), dup)
		require.ErrorIs(t, err, retry.ErrDuplicate)
		require.Equal(t, []byte(rec.Result), []byte(dup.Result()), "a duplicate gets the stored bytes")
	}
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
}

func TestResult_RolledBackHandlerStoresNone(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	fail := true
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if fail {
			require.NoError(t, msg.SetResult("from the failed run"))
			return errors.New("boom")
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (key, amount) VALUES ($1, 1)`, msg.Key)
		return err // no result this time
	}, nil)
	msg := newMsg(t, "c", order{OrderID: "1"}, false)
	require.Error(t, h.Handle(t.Context(), msg))
	rec := b.get(t, "c", msg.Key)
	require.Equal(t, inbox.RecordFailed, rec.Status)
	require.Nil(t, rec.Result)

	// The same delivery again (an in-process retry): the failed run's
	// result must not be stored with this run's effect.
	fail = false
	require.NoError(t, h.Handle(t.Context(), msg))
	rec = b.get(t, "c", msg.Key)
	require.Equal(t, inbox.RecordCompleted, rec.Status)
	require.Nil(t, rec.Result)
}

func TestResult_OversizeIsPermanentAndCommitsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, &inbox.StoreConfig{MaxResultBytes: 32})
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if err := resultHandler()(ctx, tx, msg); err != nil {
			return err
		}
		return msg.SetResult(map[string]string{"padding": "a result longer than thirty-two bytes"})
	}, nil)
	msg := newMsg(t, "c", order{OrderID: "1"}, false)
	err := h.Handle(t.Context(), msg)
	dec := retry.Classify(err)
	require.Equal(t, retry.KindPermanent, dec.Kind, "%v", err)
	require.Equal(t, inbox.ReasonResultTooLarge, dec.Reason)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM effects`))
	require.NotEqual(t, inbox.RecordCompleted, b.get(t, "c", msg.Key).Status)
}

func TestResult_GroupCommitKeepsEachDeliverysOwn(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	const n = 5
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if _, err := tx.Exec(ctx, `INSERT INTO effects (key, amount) VALUES ($1, $2)`, msg.Key, msg.Body.Amount); err != nil {
			return err
		}
		if err := msg.SetResult(paymentResult{PaymentID: int64(msg.Body.Amount), Order: msg.Body.OrderID}); err != nil {
			return err
		}
		if msg.Body.OrderID == "2" {
			return retry.Permanent(errors.New("declined"))
		}
		return nil
	}, &inbox.GroupCommit{MaxBatch: n, MaxWait: time.Minute, MaxInFlight: 1})
	msgs := make([]*inboxtype.Message[order], n)
	for i := range msgs {
		msgs[i] = newMsg(t, "c", order{OrderID: strconv.Itoa(i), Amount: 100 + i}, false)
	}
	errs := handleAll(t, h, msgs)
	for i, m := range msgs {
		rec := b.get(t, "c", m.Key)
		if i == 2 {
			require.Error(t, errs[i])
			require.Nil(t, rec.Result, "a failed delivery stores no result")
			continue
		}
		require.NoError(t, errs[i])
		require.Equal(t, paymentResult{PaymentID: int64(100 + i), Order: strconv.Itoa(i)}, decodeResult(t, rec.Result))
	}
}

func TestResult_InFlightDuplicateGetsTheSameResult(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	pids := make(chan int32, 1)
	release := make(chan struct{})
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		var pid int32
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return err
		}
		pids <- pid
		<-release
		return resultHandler()(ctx, tx, msg)
	}, nil)
	o := order{OrderID: "1", Amount: 5}
	first, dup := newMsg(t, "c", o, false), newMsg(t, "c", o, false)
	firstErr := make(chan error, 1)
	go func() { firstErr <- h.Handle(t.Context(), first) }()
	pid := <-pids

	// The duplicate's claim waits on the first transaction's row lock.
	dupErr := make(chan error, 1)
	go func() { dupErr <- h.Handle(t.Context(), dup) }()
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, pid) == 1
	}, 10*time.Second, 10*time.Millisecond)
	close(release)

	require.NoError(t, <-firstErr)
	require.ErrorIs(t, <-dupErr, retry.ErrDuplicate)
	rec := b.get(t, "c", o.IdempotencyKey())
	require.Equal(t, []byte(rec.Result), []byte(dup.Result()))
	require.Equal(t, o.OrderID, decodeResult(t, dup.Result()).Order)
}

func TestResult_ClaimModeStoresTheOutsideAnswer(t *testing.T) {
	t.Parallel()
	for _, group := range []bool{false, true} {
		t.Run("group_commit="+strconv.FormatBool(group), func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			gw := &gateway{}
			entered := make(chan struct{}, 1)
			release := make(chan struct{})
			var gc *inbox.GroupCommit
			if group {
				gc = &inbox.GroupCommit{}
			}
			h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
				raw, err := c.Step(ctx, "charge", func(ctx context.Context) (any, error) { return gw.charge(ctx, c.Key) })
				if err != nil {
					return err
				}
				entered <- struct{}{}
				<-release
				if err := msg.SetResult(raw); err != nil {
					return err
				}
				return c.Complete(ctx, completeWithEffect(msg))
			}, gc, nil)
			o := order{OrderID: "1", Amount: 5}
			firstErr := make(chan error, 1)
			go func() { firstErr <- h.Handle(t.Context(), newMsg(t, "c", o, false)) }()
			<-entered

			// In flight: the key is processing, and a copy is deferred
			// (never given a result of its own).
			early := newMsg(t, "c", o, false)
			err := h.Handle(t.Context(), early)
			require.Equal(t, inbox.ReasonClaimHeld, retry.Classify(err).Reason, "%v", err)
			require.Nil(t, early.Result())
			close(release)
			require.NoError(t, <-firstErr)

			rec := b.get(t, "c", o.IdempotencyKey())
			require.JSONEq(t, `{"charge_id":"ch_1"}`, string(rec.Result))
			// The deferred copy comes back: a duplicate with the stored result.
			require.ErrorIs(t, h.Handle(t.Context(), early), retry.ErrDuplicate)
			require.Equal(t, []byte(rec.Result), []byte(early.Result()))
			require.Equal(t, int64(1), gw.calls.Load())
		})
	}
}
