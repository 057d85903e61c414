package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// Deliveries that finish together, as a group commit's batch does, are
// acked with one frame (multiple=true over the run), and every one of them
// is settled as its handler asked: nothing is left unacked or requeued,
// and the one that failed went through the dead-letter path (its copy is
// in the DLQ; the acker's unit tests prove a multiple ack never covers a
// delivery that is still running or nacked).
func TestConsumer_AcksOfABatchAreCoalesced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 64
	var entered atomic.Int32
	all := make(chan struct{})
	r := consumer.NewRouter()
	opts := fastOpts()
	opts.Queue.Concurrency = n
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(ctx context.Context, m *inboxtype.Message[order]) error {
		// A barrier: every delivery of the "batch" returns at once.
		if entered.Add(1) == n {
			close(all)
		}
		select {
		case <-all:
		case <-ctx.Done():
			return ctx.Err()
		}
		if m.Body.ID == "31" {
			return retry.Permanent(errors.New("bad order"))
		}
		return nil
	}), opts)
	c := b.newConsumer(t, r, nil)
	// The first round of frames waits until every delivery asked to be
	// settled, as a batch's deliveries do when they commit together.
	var first sync.Once
	consumer.SetAckRoundHook(c, func(queued func() int) {
		first.Do(func() {
			// Bounded, and not t.Fatal: this runs on the consumer's goroutine
			// (a timeout shows as more than one frame below).
			deadline := time.Now().Add(testenv.Timeout())
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for queued() < n && time.Now().Before(deadline) {
				<-tick.C
			}
		})
	})
	require.NoError(t, c.Start(t.Context()))
	for i := range n {
		b.publish(t, b.queue, fmt.Sprintf(`{"id":"%d","amount":1}`, i))
	}

	acked, dead := 0, 0
	for range n {
		o := b.rec.next(t)
		require.NoError(t, o.Outcome.Err)
		switch o.Outcome.Action {
		case inboxtype.ActionAcked:
			acked++
		case inboxtype.ActionDeadLettered:
			dead++
			require.Equal(t, "31", o.ID)
		default:
			t.Fatalf("unexpected action %s for %s", o.Outcome.Action, o.ID)
		}
	}
	require.Equal(t, n-1, acked)
	require.Equal(t, 1, dead)
	frames, settled := consumer.AckStats(c)
	b.stop(t, c)
	testenv.WaitChan(t, c.Stopped(), "stopped")

	require.Equal(t, uint64(n), settled)
	require.Equal(t, uint64(1), frames, "acks of deliveries finishing together: one multiple ack")
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue), "every delivery settled, none requeued on close")
	require.Len(t, amqptest.Drain(t, b.conn, b.queue+".dlq"), 1)
}
