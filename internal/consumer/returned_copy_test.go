package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/retry"
)

// A dead-letter copy whose queue was deleted behind the consumer's back is
// returned by the broker (mandatory) although it is confirmed. The original
// must not be acked (that would lose the message): it is requeued, the
// topology is declared again, and the redelivery reaches the DLQ.
func TestConsumer_ReturnedCopyRequeuesAndRedeclares(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error {
		calls.Add(1)
		return retry.Permanent(errors.New("card declined"))
	}), fastOpts())
	c := b.start(t, r, nil)

	ch, err := b.conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDelete(b.queue+".dlq", false, false, false)
	require.NoError(t, err)
	require.NoError(t, ch.Close())

	b.publish(t, b.queue, `{"id":"lost?","amount":5}`)
	first := b.rec.next(t)
	require.Equal(t, inboxtype.ActionRequeued, first.Outcome.Action, "never acked while its copy is lost")
	require.ErrorContains(t, first.Outcome.Err, "returned unroutable")
	second := b.rec.next(t)
	require.Equal(t, inboxtype.ActionDeadLettered, second.Outcome.Action)
	b.stop(t, c)

	dead := amqptest.Drain(t, b.conn, b.queue+".dlq")
	require.Len(t, dead, 1, "exactly one copy in the re-declared DLQ")
	require.Equal(t, "permanent: card declined", dead[0].Headers[inboxtype.HeaderError])
	require.Equal(t, int32(2), calls.Load())
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue))
}

// While copies keep failing (here the DLQ is missing and the topology is
// not the consumer's to declare), the original is requeued after a growing
// pause each time: the route never spins through handler runs.
func TestConsumer_FailingCopiesAreRequeuedWithGrowingPauses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(b.queue, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.Close())

	r := consumer.NewRouter()
	opts := fastOpts()
	opts.Queue.NoDeclare = true
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error {
		return retry.Permanent(errors.New("card declined"))
	}), opts)
	c := b.start(t, r, nil)
	b.publish(t, b.queue, `{"id":"spin?","amount":5}`)

	// Pauses of 100ms·2ⁿ⁻¹ with jitter in [0.5, 1.5): lower bounds only.
	for i, atLeast := range []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond} {
		o := b.rec.next(t)
		require.Equal(t, inboxtype.ActionRequeued, o.Outcome.Action, "requeue %d", i+1)
		require.ErrorContains(t, o.Outcome.Err, "returned unroutable")
		require.GreaterOrEqual(t, o.Outcome.Duration, atLeast, "requeue %d waited", i+1)
	}
	b.stop(t, c)
	require.Equal(t, 1, amqptest.Depth(t, b.conn, b.queue), "never acked: still in the work queue")
}
