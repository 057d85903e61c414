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
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// effectHandler writes one effect row and one ledger row per message.
func effectHandler(calls *atomic.Int64) inbox.TxHandlerFunc[order] {
	return func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if calls != nil {
			calls.Add(1)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO effects (key, amount) VALUES ($1, $2)`, msg.Key, msg.Body.Amount); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO ledger (key) VALUES ($1)`, msg.Key)
		return err
	}
}

func TestHandler_OneEffectUnderConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var calls atomic.Int64
	h := inbox.Handler(b.store, effectHandler(&calls), nil)

	const n = 12
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		msg := newMsg(t, "payments", order{OrderID: "1", Amount: 5}, false)
		wg.Go(func() { errs[i] = h.Handle(t.Context(), msg) })
	}
	wg.Wait()
	var ok, dup int
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, retry.ErrDuplicate):
			dup++
			require.Equal(t, retry.KindDuplicate, retry.Classify(err).Kind)
			require.Equal(t, retry.SourceInbox, retry.Classify(err).Source)
		default:
			require.NoError(t, err)
		}
	}
	require.Equal(t, 1, ok)
	require.Equal(t, n-1, dup)
	require.Equal(t, int64(1), calls.Load())
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
	r := b.get(t, "payments", "order:1")
	require.Equal(t, inbox.RecordCompleted, r.Status)
	require.Equal(t, 1, r.Attempts)
	require.NotNil(t, r.CompletedAt)
}

// Every mode records the claim's fence on the delivery (InboxFence) and
// reports StatusProcessing once before the handler runs; the Redis lock's
// fence (LockFence) is left alone.
func TestHandler_SetsFenceAndProcessingTransition(t *testing.T) {
	t.Parallel()
	// seen records, per key, the fence the handler saw on its delivery.
	type seen = *sync.Map
	claim := func(s *inbox.Store, gc *inbox.GroupCommit, fences seen) inboxtype.Handler[order] {
		return inbox.ClaimHandler(s, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
			fences.Store(msg.Key, msg.Delivery.InboxFence)
			return c.Complete(ctx, nil)
		}, gc, nil)
	}
	txh := func(s *inbox.Store, gc *inbox.GroupCommit, fences seen) inboxtype.Handler[order] {
		return inbox.Handler(s, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
			fences.Store(msg.Key, msg.Delivery.InboxFence)
			return effectHandler(nil)(ctx, tx, msg)
		}, gc)
	}
	for _, tc := range []struct {
		name    string
		handler func(*inbox.Store, *inbox.GroupCommit, seen) inboxtype.Handler[order]
		gc      *inbox.GroupCommit
	}{
		{"PerMessage", txh, nil},
		{"GroupCommit", txh, &inbox.GroupCommit{MaxBatch: 4}},
		{"Claim", claim, nil},
		{"ClaimGroupCommit", claim, &inbox.GroupCommit{MaxBatch: 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			var fences sync.Map
			h := tc.handler(b.store, tc.gc, &fences)
			const n = 4
			msgs := make([]*inboxtype.Message[order], n)
			obs := make([]*transitions, n)
			for i := range n {
				obs[i] = &transitions{}
				msgs[i] = newMsg(t, "payments", order{OrderID: "f" + strconv.Itoa(i), Amount: 1}, false)
				msgs[i].Delivery = inboxtype.NewDelivery("q", "payments", "w1", msgs[i].Delivery.Raw, obs[i])
				msgs[i].Delivery.LockFence = 42
			}
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() { errs[i] = h.Handle(t.Context(), msgs[i]) })
			}
			wg.Wait()
			for i := range n {
				require.NoError(t, errs[i])
				require.Equal(t, []inboxtype.Status{inboxtype.StatusProcessing}, obs[i].statuses())
				f, _ := fences.Load(msgs[i].Key)
				require.Equal(t, int64(1), f, "the fence is set before the handler runs")
				require.Equal(t, int64(1), msgs[i].Delivery.InboxFence)
				require.Equal(t, int64(42), msgs[i].Delivery.LockFence, "the inbox leaves the lock's fence alone")
			}
		})
	}
}

func TestHandler_FailureRollsBackAndIsRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	fail := true
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if err := effectHandler(nil)(ctx, tx, msg); err != nil {
			return err
		}
		if fail {
			return errors.New("gateway said no")
		}
		return nil
	}, nil)

	err := h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "2", Amount: 7}, false))
	require.ErrorContains(t, err, "gateway said no")
	require.Equal(t, retry.KindRetry, retry.Classify(err).Kind)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM effects`))
	r := b.get(t, "payments", "order:2")
	require.Equal(t, inbox.RecordFailed, r.Status)
	require.Equal(t, 1, r.Attempts)
	require.NotNil(t, r.LastError)
	require.Contains(t, *r.LastError, "gateway said no")
	require.NotNil(t, r.LastFailedAt)

	fail = false
	retried := newMsg(t, "payments", order{OrderID: "2", Amount: 7}, false)
	retried.Attempt = 2 // the broker's retry copy
	require.NoError(t, h.Handle(t.Context(), retried))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM ledger`))
	r = b.get(t, "payments", "order:2")
	require.Equal(t, inbox.RecordCompleted, r.Status)
	require.Equal(t, 2, r.Attempts, "the broker attempt that took the key up")

	err = h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "2", Amount: 7}, false))
	require.ErrorIs(t, err, retry.ErrDuplicate)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
}

func TestHandler_KeyConflictOnDifferentPayload(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := inbox.Handler(b.store, effectHandler(nil), nil)
	require.NoError(t, h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "3", Amount: 1}, false)))
	err := h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "3", Amount: 999}, false))
	require.ErrorIs(t, err, retry.ErrKeyConflict)
	d := retry.Classify(err)
	require.Equal(t, retry.KindPermanent, d.Kind)
	require.Equal(t, retry.ReasonKeyConflict, d.Reason)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
}

func TestHandler_ComparesTheDeliveryFingerprint(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := inbox.Handler(b.store, effectHandler(nil), nil)
	// The inbox records and compares Delivery.Fingerprint, the value the
	// completed-cache compares too, not a fingerprint of its own.
	withFP := func(o order, fp string) *inboxtype.Message[order] {
		msg := newMsg(t, "payments", o, false)
		msg.Delivery.Fingerprint = []byte(fp)
		return msg
	}
	require.NoError(t, h.Handle(t.Context(), withFP(order{OrderID: "fp", Amount: 1}, "A")))
	require.Equal(t, []byte("A"), b.get(t, "payments", "order:fp").Fingerprint)
	require.ErrorIs(t, h.Handle(t.Context(), withFP(order{OrderID: "fp", Amount: 2}, "A")), retry.ErrDuplicate,
		"same fingerprint, other body: a duplicate")
	require.ErrorIs(t, h.Handle(t.Context(), withFP(order{OrderID: "fp", Amount: 1}, "B")), retry.ErrKeyConflict,
		"other fingerprint, same body: a conflict")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
}

func TestHandler_BusinessUniqueViolationIsDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		_, err := tx.Exec(ctx, `INSERT INTO orders (order_id) VALUES ('same-order')`)
		return err
	}, nil)
	require.NoError(t, h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "a"}, false)))
	err := h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "b"}, false))
	require.ErrorIs(t, err, retry.ErrDuplicate)
	d := retry.Classify(err)
	require.Equal(t, retry.KindDuplicate, d.Kind)
	require.Equal(t, retry.SourceBusiness, d.Source)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM orders`))
}

func TestHandler_SerializationFailureIsRetryable(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	const injected = 3
	var calls atomic.Int64
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if calls.Add(1) <= injected {
			_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40001'; END $$`)
			return err
		}
		return effectHandler(nil)(ctx, tx, msg)
	}, nil)
	attempt := func(n int) *inboxtype.Message[order] {
		m := newMsg(t, "payments", order{OrderID: "s"}, false)
		m.Attempt = n
		return m
	}
	for i := range injected {
		err := h.Handle(t.Context(), attempt(i+1))
		d := retry.Classify(err)
		require.Equal(t, retry.KindRetry, d.Kind)
		require.Equal(t, inbox.ReasonDBSerialization, d.Reason)
	}
	require.Equal(t, injected, b.get(t, "payments", "order:s").Attempts)
	require.NoError(t, h.Handle(t.Context(), attempt(injected+1)))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, injected+1, b.get(t, "payments", "order:s").Attempts)
}

func TestHandler_CrashLoopBound(t *testing.T) {
	t.Parallel()
	b := setup(t, &inbox.StoreConfig{CrashLimit: 3})
	var calls atomic.Int64
	h := inbox.Handler(b.store, func(context.Context, pgx.Tx, *inboxtype.Message[order]) error {
		calls.Add(1)
		return errors.New("worker would have crashed here")
	}, nil)
	for range 3 {
		err := h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "c"}, true))
		require.ErrorContains(t, err, "crashed")
	}
	err := h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "c"}, true))
	d := retry.Classify(err)
	require.Equal(t, retry.KindPermanent, d.Kind)
	require.Equal(t, inbox.ReasonCrashLoop, d.Reason)
	require.Equal(t, int64(3), calls.Load())
	r := b.get(t, "payments", "order:c")
	require.Equal(t, inbox.RecordDead, r.Status)
	require.Equal(t, 4, r.Deliveries)

	// A first delivery (not redelivered) never pays for the counter.
	require.ErrorContains(t, h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "d"}, false)), "crashed")
	require.Equal(t, 0, b.get(t, "payments", "order:d").Deliveries)
}

func TestHandler_RedeliveredCompletedIsDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := inbox.Handler(b.store, effectHandler(nil), nil)
	require.NoError(t, h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "r"}, false)))
	err := h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "r"}, true))
	require.ErrorIs(t, err, retry.ErrDuplicate)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
}

func TestHandler_EmptyKeyIsPermanent(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	msg := newMsg(t, "payments", order{OrderID: "e"}, false)
	msg.Key = ""
	err := inbox.Handler(b.store, effectHandler(nil), nil).Handle(t.Context(), msg)
	require.Equal(t, retry.KindPermanent, retry.Classify(err).Kind)
}

func TestHandler_PanicBecomesError(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := inbox.Handler(b.store, func(context.Context, pgx.Tx, *inboxtype.Message[order]) error { panic("boom") }, nil)
	err := h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "p"}, false))
	require.Equal(t, retry.ReasonPanic, retry.Classify(err).Reason)
	require.Equal(t, inbox.RecordFailed, b.get(t, "payments", "order:p").Status)
}

func TestHandler_ConsumersAreNamespaces(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := inbox.Handler(b.store, effectHandler(nil), nil)
	for i := range 3 {
		require.NoError(t, h.Handle(t.Context(), newMsg(t, "c"+strconv.Itoa(i), order{OrderID: "n"}, false)))
	}
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM effects`))
}

// transitions records the statuses a delivery went through.
type transitions struct {
	inboxtype.NopObserver
	mu   sync.Mutex
	seen []inboxtype.Status
}

func (o *transitions) OnTransition(_ *inboxtype.Delivery, status inboxtype.Status, _ error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen = append(o.seen, status)
}

func (o *transitions) statuses() []inboxtype.Status {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]inboxtype.Status(nil), o.seen...)
}

func TestHandler_ConcurrentDuplicateProceedsWhenTheFirstRollsBack(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	entered := make(chan struct{})
	release := make(chan struct{})
	var calls atomic.Int64
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if calls.Add(1) == 1 {
			close(entered)
			<-release
			return errors.New("first copy fails after holding the key")
		}
		return effectHandler(nil)(ctx, tx, msg)
	}, nil)
	first, second := newMsg(t, "payments", order{OrderID: "rb"}, false), newMsg(t, "payments", order{OrderID: "rb"}, false)
	firstErr, secondErr := make(chan error, 1), make(chan error, 1)
	go func() { firstErr <- h.Handle(t.Context(), first) }()
	testenv.WaitChan(t, entered, "first copy holds the key")
	go func() { secondErr <- h.Handle(t.Context(), second) }()
	close(release)
	require.ErrorContains(t, testenv.WaitChan(t, firstErr, "first copy"), "first copy fails")
	require.NoError(t, testenv.WaitChan(t, secondErr, "second copy"))
	require.Equal(t, int64(2), calls.Load())
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, inbox.RecordCompleted, b.get(t, "payments", "order:rb").Status)
}
