package consumer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// A delivery whose settlement fails by breaking its session (here its
// channel closes before the ack, every time until the fifth) is redelivered
// on the next session at once; it must not run again at once. Each return
// waits longer (100ms doubling, jittered in [0.5, 1.5)), across sessions,
// so the failure never becomes a hot loop of handler runs and reconnects.
func TestConsumer_SettlementFailuresAcrossSessionsWaitLongerEachTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runs := make(chan time.Time, 16)
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error {
		runs <- time.Now()
		return nil
	}), fastOpts())
	c := b.newConsumer(t, r, nil)
	const failures = 4
	var acks atomic.Int32
	consumer.SetTestHooks(c, func(d *inboxtype.Delivery) {
		if acks.Add(1) <= failures {
			ch, ok := d.Raw.Acknowledger.(*amqp.Channel)
			require.True(t, ok)
			_ = ch.Close() // the ack that follows fails; the session ends
		}
	}, nil)
	require.NoError(t, c.Start(t.Context()))
	b.publish(t, b.queue, `{"id":"s1","amount":1}`)

	prev := testenv.WaitChan(t, runs, "first run")
	for i := range failures {
		o := b.rec.next(t)
		require.Equal(t, inboxtype.ActionAbandoned, o.Outcome.Action, "failure %d", i+1)
		require.Error(t, o.Outcome.Err)
		at := testenv.WaitChan(t, runs, "run after a failed settlement")
		atLeast := 50 * time.Millisecond << i
		require.GreaterOrEqual(t, at.Sub(prev), atLeast, "run %d waited after failure %d", i+2, i+1)
		prev = at
	}
	require.Equal(t, inboxtype.ActionAcked, b.rec.next(t).Outcome.Action)
	b.stop(t, c)
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue))
	connected := 0
	for _, s := range b.rec.drainStates() {
		if s == inboxtype.ConnConnected {
			connected++
		}
	}
	require.Equal(t, failures+1, connected, "one reconnect per failure, no more")
}
