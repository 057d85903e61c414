package inbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// extendTracer counts the lease extensions sent, per key.
type extendTracer struct {
	mu sync.Mutex
	n  map[string]int
}

func (tr *extendTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "SET lease_until = LEAST") && len(d.Args) > 1 {
		if key, ok := d.Args[1].(string); ok {
			tr.mu.Lock()
			tr.n[key]++
			tr.mu.Unlock()
		}
	}
	return ctx
}

func (tr *extendTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (tr *extendTracer) count(key string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.n[key]
}

// The lease heartbeat beats while its handler runs and ends with its
// delivery: once Handle returned — completed, failed (the claim released)
// or by a panic after Complete — no extension of that claim is sent, while
// a later delivery's heartbeat beats many times over.
func TestClaim_HeartbeatEndsWithItsDelivery(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tr := &extendTracer{n: map[string]int{}}
	b := setupOn(t, tracedPool(t, tr), nil)
	opts := &inbox.ClaimOpts{Lease: 5 * time.Second, Heartbeat: 10 * time.Millisecond}
	h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		beats := 2
		if msg.Body.OrderID == "later" {
			beats = 10
		}
		testenv.WaitFor(t, "the heartbeat's extensions", func() bool { return tr.count(c.Key) >= beats })
		if msg.Body.OrderID == "fails" {
			return errors.New("inbox test: the handler failed")
		}
		if err := c.Complete(ctx, completeWithEffect(msg)); err != nil {
			return err
		}
		if msg.Body.OrderID == "panics" {
			panic("inbox test: a panic after Complete")
		}
		return nil
	}, nil, opts)

	require.NoError(t, h.Handle(ctx, newMsg(t, "pay", order{OrderID: "returns", Amount: 1}, false)))
	require.Panics(t, func() { _ = h.Handle(ctx, newMsg(t, "pay", order{OrderID: "panics", Amount: 1}, false)) })
	require.Error(t, h.Handle(ctx, newMsg(t, "pay", order{OrderID: "fails", Amount: 1}, false)))
	ended := map[string]int{}
	for _, key := range []string{"order:returns", "order:panics", "order:fails"} {
		ended[key] = tr.count(key)
	}

	// Ten beats of a later delivery: an ended heartbeat, had it gone on,
	// would have beaten about as often meanwhile.
	require.NoError(t, h.Handle(ctx, newMsg(t, "pay", order{OrderID: "later", Amount: 1}, false)))
	for key, n := range ended {
		require.Equal(t, n, tr.count(key), "no extension of %s after its delivery ended", key)
		r := b.get(t, "pay", key)
		want := inbox.RecordCompleted
		if key == "order:fails" {
			want = inbox.RecordFailed // released
		}
		require.Equal(t, want, r.Status, key)
		require.Nil(t, r.Owner, key)
	}
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM effects`))
}
