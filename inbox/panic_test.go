package inbox_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/logtest"
	"github.com/inboxmq/inboxmq/retry"
)

// A handler that panics inside the inbox fails its own delivery only, with
// reason panic and a failed row, whatever the mode: in group commit the
// handler runs on the goroutine of another delivery (the batch's leader),
// where the consumer's last guard cannot catch it, so the inbox recovers
// there and logs the stack once.
func TestHandler_PanicFailsOnlyItsDeliveryInEveryMode(t *testing.T) {
	t.Parallel()
	modes := map[string]*inbox.GroupCommit{
		"per-message":  nil,
		"group commit": fullBatch(3),
	}
	for name, opts := range modes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			logger, logs := logtest.New(slog.LevelError)
			b := setup(t, &inbox.StoreConfig{Logger: logger})
			var panicked atomic.Int64
			h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
				if msg.Body.OrderID == "2" {
					panicked.Add(1)
					panic("nil map write")
				}
				return effectHandler(nil)(ctx, tx, msg)
			}, opts)
			errs := handleAll(t, h, orders(t, 3))
			requireOnlyRetry(t, errs, 1, retry.ReasonPanic)
			require.ErrorContains(t, errs[1], "inbox: handler panicked: nil map write")
			require.Equal(t, 2, b.count(t, `SELECT count(*) FROM effects`))
			require.Equal(t, inbox.RecordFailed, b.get(t, "payments", "order:2").Status)

			panics := logs.Message("inbox: handler panicked")
			require.NotZero(t, panicked.Load())
			require.Len(t, panics, int(panicked.Load()), "each panic's stack is logged once")
			for _, e := range panics {
				require.Equal(t, []string{"stack"}, e.StackKeys(), "no stack besides the panic's own")
				require.Equal(t, "order:2", e.Attrs["idempotency_key"])
				stack, _ := e.Attrs["stack"].(string)
				require.Equal(t, 1, strings.Count(stack, "panic_test.go"), "the panic's stack, once")
			}
		})
	}
}

// In claim mode the handler runs on its delivery's own goroutine: its
// panic goes on to the consumer's last guard (the one recover of the
// path), and the claim is released on the way, so a retry can take the
// key at once instead of after the lease.
func TestClaimHandler_PanicReleasesTheClaimAndGoesOn(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := inbox.ClaimHandler(b.store, func(context.Context, *inbox.Claim, *inboxtype.Message[order]) error {
		panic("nil map write")
	}, nil, nil)
	msg := newMsg(t, "payments", order{OrderID: "p"}, false)
	require.PanicsWithValue(t, "nil map write", func() { _ = h.Handle(t.Context(), msg) })
	r := b.get(t, "payments", "order:p")
	require.Equal(t, inbox.RecordFailed, r.Status, "released, not left processing until the lease ends")
	require.Nil(t, r.Owner)
	require.Contains(t, *r.LastError, "panicked")
}
