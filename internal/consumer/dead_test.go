package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// deadLetterLog records the route's OnDeadLetter calls.
type deadLetterLog struct {
	mu   sync.Mutex
	seen []consumer.DeadLetter
}

func (l *deadLetterLog) hook(_ context.Context, dl consumer.DeadLetter) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen = append(l.seen, dl)
	return nil
}

func (l *deadLetterLog) all() []consumer.DeadLetter {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]consumer.DeadLetter(nil), l.seen...)
}

// A message the broker dead-letters from the work queue (it expired, or
// a quorum queue's delivery limit ended a crash loop) reaches the DLQ
// through the consumer's own dead-letter settlement: its copy names the
// broker's reason, carries its key, and OnDeadLetter runs once for it, as
// for a handler's permanent failure.
func TestConsumer_BrokerDeadLettersAreFiledWithTheirReason(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		typ    consumer.QueueType
		reason string
	}{
		{"classic expiry", consumer.Classic, "broker_expired"},
		{"quorum expiry", consumer.Quorum, "broker_expired"},
		{"quorum delivery limit", consumer.Quorum, "broker_delivery_limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var dead deadLetterLog
			opts := fastOpts()
			opts.Queue.Type, opts.OnDeadLetter = tt.typ, dead.hook
			if tt.typ == consumer.Quorum {
				opts.Queue.DeliveryLimit = 2
			}
			var calls int
			var mu sync.Mutex
			r := consumer.NewRouter()
			consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
				mu.Lock()
				calls++
				mu.Unlock()
				ch, ok := m.Delivery.Raw.Acknowledger.(*amqp.Channel)
				require.True(t, ok)
				_ = ch.Close() // the worker "crashes": nothing is settled
				return nil
			}), opts)
			c := b.newConsumer(t, r, nil)
			if tt.reason == "broker_expired" {
				require.NoError(t, c.Pause(b.queue)) // the message expires unconsumed
			}
			require.NoError(t, c.Start(t.Context()))
			msg := amqp.Publishing{MessageId: "m-1"}
			if tt.reason == "broker_expired" {
				msg.Expiration = "50"
			}
			b.pub.Publish(b.queue, []byte(`{"id":"p1","amount":5}`), msg)

			testenv.WaitFor(t, "the dead letter filed in the DLQ", func() bool { return amqptest.Depth(t, b.conn, b.queue+".dlq") == 1 })
			// Its settlement ends with the ack of the dead queue's copy:
			// the observers hear of it after that ack, so stopping now
			// requeues nothing.
			for b.rec.next(t).Outcome.Action != inboxtype.ActionDeadLettered { //nolint:revive // each outcome is waited for
			}
			b.stop(t, c)
			dlq := amqptest.Drain(t, b.conn, b.queue+".dlq")
			require.Len(t, dlq, 1)
			h := dlq[0].Headers
			require.Equal(t, "m-1", dlq[0].MessageId)
			require.Contains(t, h[inboxtype.HeaderError], tt.reason+": consumer: the broker dead-lettered the message from")
			require.Equal(t, "order:p1", h[inboxtype.HeaderIdempotencyKey])
			require.Equal(t, b.queue, h[inboxtype.HeaderOriginalQueue])
			require.Equal(t, b.queue, inboxtype.DeadLetterOrigin(h))
			require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue+".dead"), "filed, then acked")

			got := dead.all()
			require.Len(t, got, 1, "OnDeadLetter runs once per dead letter")
			require.Equal(t, retry.KindPermanent, got[0].Decision.Kind)
			require.Equal(t, tt.reason, got[0].Decision.Reason)
			require.Equal(t, "order:p1", got[0].Delivery.Key)
			mu.Lock()
			defer mu.Unlock()
			if tt.reason == "broker_expired" {
				require.Zero(t, calls, "the handler never runs for a dead letter")
			} else {
				require.LessOrEqual(t, calls, 3, "bounded by the delivery limit")
			}
		})
	}
}

// heldFiling is a route whose first dead letter's OnDeadLetter hook holds
// its filing, after the copy's confirm and before the ack, until release
// closes (entered closes when it begins), and whose handler closes the
// work queue's channel on its first message: the session fails while the
// filing is held.
type heldFiling struct {
	entered, release chan struct{}
	dead             deadLetterLog
	router           *consumer.Router
}

func newHeldFiling(t *testing.T, b *testBundle) *heldFiling {
	t.Helper()
	f := &heldFiling{entered: make(chan struct{}), release: make(chan struct{}), router: consumer.NewRouter()}
	opts := fastOpts()
	opts.OnDeadLetter = func(ctx context.Context, dl consumer.DeadLetter) error {
		first := len(f.dead.all()) == 0
		_ = f.dead.hook(ctx, dl)
		if first {
			close(f.entered)
			select {
			case <-f.release:
			case <-t.Context().Done():
			}
		}
		return nil
	}
	var closedOnce sync.Once
	consumer.Register(f.router, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		closedOnce.Do(func() {
			ch, ok := m.Delivery.Raw.Acknowledger.(*amqp.Channel)
			require.True(t, ok)
			_ = ch.Close() // the work queue's channel fails
		})
		return nil
	}), opts)
	return f
}

// failWhileHeld starts a consumer of f's route (cfg changed by mutate) and
// brings about the failure: "a" expires unconsumed into the dead queue and
// its filing is held in the hook; then "b" is consumed, and its handler
// closes the work channel. It returns once the session failed.
func (f *heldFiling) failWhileHeld(t *testing.T, b *testBundle, mutate func(*consumer.Config)) *consumer.Consumer {
	t.Helper()
	c := b.newConsumer(t, f.router, mutate)
	require.NoError(t, c.Pause(b.queue)) // "a" expires unconsumed
	require.NoError(t, c.Start(t.Context()))
	b.pub.Publish(b.queue, []byte(`{"id":"a","amount":1}`), amqp.Publishing{MessageId: "m-a", Expiration: "50"})
	testenv.WaitChan(t, f.entered, "the dead letter's copy confirmed, its hook entered")

	require.NoError(t, c.Resume(b.queue))
	b.pub.Publish(b.queue, []byte(`{"id":"b","amount":1}`), amqp.Publishing{MessageId: "m-b"})
	b.rec.waitState(t, inboxtype.ConnDisconnected)
	return c
}

// A session that fails while a dead letter is being filed on another of
// its channels lets that filing finish: the failure of the work queue's
// channel (here a handler closes it) does not cut the dead queue's
// settlement off between its copy's confirm and its ack, which would
// leave the broker to redeliver it and the consumer to file a second copy
// and run OnDeadLetter again.
func TestConsumer_FilingOutlivesAnotherChannelsFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := newHeldFiling(t, b)
	c := f.failWhileHeld(t, b, nil)
	close(f.release)

	var filed, applied int
	for filed == 0 || applied == 0 {
		switch o := b.rec.next(t); {
		case o.Outcome.Action == inboxtype.ActionDeadLettered:
			filed++
			require.NoError(t, o.Outcome.Err, "the dead queue's copy is acked")
		case o.ID == "b" && o.Outcome.Action == inboxtype.ActionAcked:
			applied++
		}
	}
	b.rec.waitState(t, inboxtype.ConnConnected)
	b.stop(t, c)
	dlq := amqptest.Drain(t, b.conn, b.queue+".dlq")
	require.Len(t, dlq, 1, "one copy in the DLQ")
	require.Equal(t, "m-a", dlq[0].MessageId)
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue+".dead"), "filed, then acked")
	require.Len(t, f.dead.all(), 1, "OnDeadLetter runs once")
}

// A filing that does not finish does not hold the session's recovery: close
// waits for it at most PublishTimeout, then the consumer reconnects and
// works on while OnDeadLetter is still stuck. The cut-off filing is
// redelivered and filed again: its hook runs twice and the DLQ holds two
// copies, the price of a hook that outlives the bound (docs/design.md).
func TestConsumer_StuckFilingDoesNotHoldTheReconnect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := newHeldFiling(t, b)
	c := f.failWhileHeld(t, b, func(cfg *consumer.Config) { cfg.PublishTimeout = 200 * time.Millisecond })
	b.rec.waitState(t, inboxtype.ConnConnected) // with the first hook still stuck
	// The new session applies "b" and files "a" again, in either order,
	// while the first filing is stuck in its hook.
	applied, filed := false, 0
	count := func(o outcomeRec) {
		switch {
		case o.ID == "b" && o.Outcome.Action == inboxtype.ActionAcked && o.Outcome.Err == nil:
			applied = true
		case o.Outcome.Action == inboxtype.ActionDeadLettered && o.Outcome.Err == nil:
			filed++
		}
	}
	for !applied {
		count(b.rec.next(t))
	}
	select {
	case <-f.release:
		t.Fatal("the hook was let go before the consumer recovered")
	default:
	}
	close(f.release)
	for filed < 1 {
		count(b.rec.next(t))
	}
	b.stop(t, c)
	require.Len(t, amqptest.Drain(t, b.conn, b.queue+".dlq"), 2, "the cut-off copy and the new one")
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue+".dead"), "filed, then acked")
	require.Len(t, f.dead.all(), 2, "OnDeadLetter ran again for the redelivery")
}
