package middleware_test

import (
	"context"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/middleware"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

type stuckReports struct {
	mu   sync.Mutex
	list []string
	got  chan middleware.StuckHandler
}

func (r *stuckReports) report(h middleware.StuckHandler, stuck bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if stuck {
		r.list = append(r.list, "stuck "+h.Key)
		r.got <- h
		return
	}
	r.list = append(r.list, "returned "+h.Key)
}

func stuckDelivery(key string) *inboxtype.Delivery {
	d := inboxtype.NewDelivery("q", "ns", "w", &amqp.Delivery{MessageId: "m-" + key})
	d.Key = key
	return d
}

// A handler that goes on after its context ended is reported once, with
// its key, and again when it returns; one that returns in time, or stops
// soon after the cancellation, is never reported.
func TestStuck_ReportsAHandlerThatOutlivesItsContext(t *testing.T) {
	t.Parallel()
	r := &stuckReports{got: make(chan middleware.StuckHandler, 1)}
	mw := middleware.Stuck(50*time.Millisecond, r.report)

	release := make(chan struct{})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- mw(func(context.Context, *inboxtype.Delivery) error {
			<-release // ignores ctx
			return nil
		})(ctx, stuckDelivery("k1"))
	}()
	cancel()
	h := testenv.WaitChan(t, r.got, "the stuck report")
	require.Equal(t, "k1", h.Key)
	require.Equal(t, "m-k1", h.MessageID)
	require.Equal(t, "q", h.Queue)
	require.Equal(t, "ns", h.Namespace)
	close(release)
	require.NoError(t, testenv.WaitChan(t, done, "the handler returns"))

	// In time, and stopping at the cancellation: no report.
	require.NoError(t, mw(func(context.Context, *inboxtype.Delivery) error { return nil })(t.Context(), stuckDelivery("k2")))
	ctx3, cancel3 := context.WithCancel(t.Context())
	cancel3()
	require.ErrorIs(t, mw(func(ctx context.Context, _ *inboxtype.Delivery) error { <-ctx.Done(); return ctx.Err() })(ctx3, stuckDelivery("k3")), context.Canceled)

	r.mu.Lock()
	defer r.mu.Unlock()
	require.Equal(t, []string{"stuck k1", "returned k1"}, r.list)
}
