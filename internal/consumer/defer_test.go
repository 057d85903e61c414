package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// A deferred retry (another worker holds the key) is not a failed attempt:
// the attempt number stays, and the policy's bound does not dead-letter it.
func TestConsumer_DeferredRetryIsNotAnAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := consumer.NewRouter()
	opts := fastOpts(100 * time.Millisecond)
	opts.Policy = retry.Exponential{InitialInterval: 10 * time.Millisecond, MaxAttempts: 1} // no counted retry at all
	attempts := make(chan int, 8)
	calls := 0
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		attempts <- m.Attempt
		calls++
		if calls <= 3 {
			return retry.WithReason("lock_unavailable", retry.Defer(50*time.Millisecond, nil))
		}
		return nil
	}), opts)
	c := b.start(t, r, nil)
	b.publish(t, b.queue, `{"id":"d1"}`)

	for i := 0; i < 3; i++ {
		require.Equal(t, 1, testenv.WaitChan(t, attempts, "deferred call"))
		o := b.rec.next(t)
		require.Equal(t, inboxtype.ActionRetried, o.Outcome.Action, "deferred, not dead-lettered")
		require.True(t, o.Outcome.Decision.Uncounted)
		require.Equal(t, "lock_unavailable", o.Outcome.Decision.Reason)
	}
	require.Equal(t, 1, testenv.WaitChan(t, attempts, "final call"))
	require.Equal(t, inboxtype.ActionAcked, b.rec.next(t).Outcome.Action)
	b.stop(t, c)
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue+".dlq"))
}
