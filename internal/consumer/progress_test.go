package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// Progress counts a delivery in flight until its settlement is over: with
// the ack held back (the settlement path stalled after the handler
// succeeded), the delivery stays in flight and LastProgress stays put;
// once the ack goes out, nothing is in flight and LastProgress moves on.
func TestConsumer_ProgressCoversTheSettlement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error {
		return nil
	}), fastOpts())
	c := b.newConsumer(t, r, nil)
	require.Equal(t, consumer.Progress{}, c.Progress(), "nothing before the first delivery")
	held, release := make(chan struct{}), make(chan struct{})
	consumer.SetTestHooks(c, func(*inboxtype.Delivery) {
		close(held)
		<-release
	}, nil)
	require.NoError(t, c.Start(t.Context()))
	defer b.stop(t, c)

	b.publish(t, b.queue, `{"id":"1"}`)
	testenv.WaitChan(t, held, "the ack is held back")
	p := c.Progress()
	require.Equal(t, 1, p.InFlight, "handled but not settled: still in flight")
	require.False(t, p.LastProgress.IsZero())
	stalledSince := p.LastProgress
	require.Equal(t, stalledSince, c.Progress().LastProgress, "no progress while the settlement is stalled")

	close(release)
	require.Equal(t, inboxtype.ActionAcked, b.rec.next(t).Outcome.Action)
	testenv.WaitFor(t, "the delivery leaves the flight", func() bool { return c.Progress().InFlight == 0 })
	require.True(t, c.Progress().LastProgress.After(stalledSince), "the settlement is progress")
	require.WithinDuration(t, time.Now(), c.Progress().LastProgress, testenv.Timeout())
}
