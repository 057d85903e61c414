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
		}, &inbox.ClaimOpts{GroupCommit: gc})
	}
	txh := func(s *inbox.Store, gc *inbox.GroupCommit, fences seen) inboxtype.Handler[order] {
		return inbox.Handler(s, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
			fences.Store(msg.Key, msg.Delivery.InboxFence)
			return effectHandler(nil)(ctx, tx, msg)
		}, &inbox.HandlerOpts{GroupCommit: gc})
	}
	for _, tc := range []struct {
		name    string
		handler func(*inbox.Store, *inbox.GroupCommit, seen) inboxtype.Handler[order]
		gc      *inbox.GroupCommit
	}{
		{"PerMessage", txh, nil},
		{"GroupCommit", txh, &inbox.GroupCommit{MaxBatch: 4}},
		{"Pipeline", txh, &inbox.GroupCommit{MaxBatch: 4, Pipeline: true}},
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
