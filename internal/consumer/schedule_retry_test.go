package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
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

// scheduled is one call of Config.ScheduleRetry.
type scheduled struct {
	queue   string
	attempt int
	delay   time.Duration
	msg     amqp.Publishing
}

// A scheduled retry waits exactly the policy's delay, not a tier's, and
// comes back through whatever ScheduleRetry arranged; nothing goes
// through the delay queues.
func TestConsumer_RetryScheduledOutsideTheBroker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	calls := make(chan scheduled, 8)
	attempts := make(chan int, 8)
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		attempts <- m.Attempt
		if m.Attempt < 3 {
			return errors.New("gateway timeout")
		}
		return nil
	}), fastOpts())
	c := b.start(t, r, func(cfg *consumer.Config) {
		cfg.ScheduleRetry = func(_ context.Context, queue string, attempt int, delay time.Duration, msg *amqp.Publishing) error {
			calls <- scheduled{queue: queue, attempt: attempt, delay: delay, msg: *msg}
			return nil
		}
	})
	body := `{"id":"s1","amount":7}`
	b.publish(t, b.queue, body)

	for want := 1; want <= 3; want++ {
		require.Equal(t, want, testenv.WaitChan(t, attempts, "handler call"))
		o := b.rec.next(t)
		if want == 3 {
			require.Equal(t, inboxtype.ActionAcked, o.Outcome.Action)
			break
		}
		s := testenv.WaitChan(t, calls, "a scheduled retry")
		require.Equal(t, b.queue, s.queue)
		require.Equal(t, want+1, s.attempt)
		require.Equal(t, int64(want+1), s.msg.Headers[inboxtype.HeaderAttempt])
		require.Equal(t, "error: gateway timeout", s.msg.Headers[inboxtype.HeaderError])
		require.Equal(t, "m-"+body, s.msg.MessageId)
		delay := 50 * time.Millisecond << (want - 1) // the policy's, with no jitter
		require.Equal(t, delay, s.delay, "the policy's delay, not rounded up to a tier")
		require.Equal(t, inboxtype.ActionRetried, o.Outcome.Action)
		require.Equal(t, delay, o.Outcome.Delay)
		b.pub.Publish(s.queue, s.msg.Body, s.msg) // the relay's part
	}
	b.stop(t, c)
	for _, tier := range []time.Duration{100 * time.Millisecond, time.Second} {
		require.Equal(t, 0, amqptest.Depth(t, b.conn, inboxtype.RetryQueue(b.queue, tier)))
	}
}

// A retry that cannot be scheduled (the database does not answer) waits in
// a delay queue instead: it is neither lost nor requeued at once.
func TestConsumer_RetryFallsBackToTheDelayQueues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	attempts := make(chan int, 8)
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		attempts <- m.Attempt
		if m.Attempt < 2 {
			return errors.New("gateway timeout")
		}
		return nil
	}), fastOpts())
	tried := make(chan struct{}, 8)
	c := b.start(t, r, func(cfg *consumer.Config) {
		cfg.ScheduleRetry = func(context.Context, string, int, time.Duration, *amqp.Publishing) error {
			tried <- struct{}{}
			return errors.New("database unreachable")
		}
	})
	b.publish(t, b.queue, `{"id":"s2","amount":7}`)

	require.Equal(t, 1, testenv.WaitChan(t, attempts, "first call"))
	testenv.WaitChan(t, tried, "the schedule tried")
	o := b.rec.next(t)
	require.Equal(t, inboxtype.ActionRetried, o.Outcome.Action)
	require.Equal(t, 100*time.Millisecond, o.Outcome.Delay, "the tier's delay")
	require.Equal(t, 2, testenv.WaitChan(t, attempts, "the retry, back from the delay queue"))
	require.Equal(t, inboxtype.ActionAcked, b.rec.next(t).Outcome.Action)
	b.stop(t, c)
}

// Only the delivery's own failures spend its attempts: a deferral and a
// lost connection (the broker returns the delivery, as after a crash)
// keep its attempt number, and the dead letter says how many attempts
// failed.
func TestConsumer_ExhaustedCountsOnlyItsOwnFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seen := make(chan int, 8)
	var calls atomic.Int32
	r := consumer.NewRouter()
	opts := fastOpts(100 * time.Millisecond)
	opts.Policy = retry.Exponential{InitialInterval: 10 * time.Millisecond, RandomizationFactor: -1, MaxAttempts: 2}
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		seen <- m.Attempt
		switch calls.Add(1) {
		case 1, 4:
			return retry.Defer(10*time.Millisecond, errors.New("rate limited"))
		case 3:
			ch, ok := m.Delivery.Raw.Acknowledger.(*amqp.Channel)
			require.True(t, ok)
			_ = ch.Close() // the delivery goes back to the broker unsettled
			return errors.New("connection lost")
		default:
			return errors.New("gateway down")
		}
	}), opts)
	c := b.start(t, r, nil)
	b.publish(t, b.queue, `{"id":"x2"}`)

	for i, want := range []int{1, 1, 2, 2, 2} {
		require.Equal(t, want, testenv.WaitChan(t, seen, "handler call"), "call %d", i+1)
	}
	var o outcomeRec
	for o.Outcome.Action != inboxtype.ActionDeadLettered { // each outcome is waited for
		o = b.rec.next(t)
	}
	require.Equal(t, retry.ReasonExhausted, o.Outcome.Decision.Reason)
	b.stop(t, c)

	dead := amqptest.Drain(t, b.conn, b.queue+".dlq")
	require.Len(t, dead, 1)
	require.Equal(t, "exhausted: after 2 failed attempts: gateway down", dead[0].Headers[inboxtype.HeaderError])
	require.Equal(t, 2, inboxtype.HeaderInt(dead[0].Headers, inboxtype.HeaderAttempt))
	require.Equal(t, int32(5), calls.Load())
}
