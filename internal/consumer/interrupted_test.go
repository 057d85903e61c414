package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// A handler's own retry.Interrupted outside a stop (its dependency dropped)
// goes through a delay tier, uncounted, instead of an immediate requeue
// that would redeliver it at once, over and over.
func TestConsumer_InterruptedOutsideStopIsDelayedNotRequeued(t *testing.T) {
	t.Parallel()
	b := setup(t)
	attempts := make(chan int, 4)
	calls := 0
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		attempts <- m.Attempt
		calls++
		if calls == 1 {
			return retry.Interrupted(errors.New("database connection dropped"))
		}
		return nil
	}), fastOpts(100*time.Millisecond))
	c := b.start(t, r, nil)
	b.publish(t, b.queue, `{"id":"i1"}`)

	o := b.rec.next(t)
	require.Equal(t, inboxtype.ActionRetried, o.Outcome.Action, "not an immediate requeue")
	require.True(t, o.Outcome.Decision.Uncounted)
	require.Equal(t, 100*time.Millisecond, o.Outcome.Delay)
	require.Equal(t, inboxtype.ActionAcked, b.rec.next(t).Outcome.Action)
	require.Equal(t, 1, testenv.WaitChan(t, attempts, "first"))
	require.Equal(t, 1, testenv.WaitChan(t, attempts, "second: the attempt was not counted"))
	b.stop(t, c)
}
