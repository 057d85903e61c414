package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
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

func TestConsumer_HappyPathAcks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	seen := map[string]string{}
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		mu.Lock()
		defer mu.Unlock()
		seen[m.Body.ID] = m.Key
		return nil
	}), fastOpts())
	c := b.start(t, r, nil)
	require.True(t, c.Ready())
	require.Equal(t, inboxtype.ConnConnected, c.State())

	for i := range 5 {
		b.publish(t, b.queue, fmt.Sprintf(`{"id":"%d","amount":1}`, i))
	}
	for range 5 {
		o := b.rec.next(t)
		require.Equal(t, inboxtype.ActionAcked, o.Outcome.Action)
		require.Equal(t, retry.KindSucceeded, o.Outcome.Decision.Kind)
		require.NoError(t, o.Outcome.Err)
	}
	b.stop(t, c)
	require.False(t, c.Ready())
	require.Equal(t, inboxtype.ConnStopped, c.State())
	testenv.WaitChan(t, c.Stopped(), "stopped")
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue), "everything acked, nothing requeued")
	require.Len(t, seen, 5)
	require.Equal(t, "order:3", seen["3"])
}

func TestConsumer_RetryThroughTier(t *testing.T) {
	t.Parallel()
	b := setup(t)
	type call struct {
		attempt int
		body    string
		headers amqp.Table
	}
	calls := make(chan call, 16)
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		calls <- call{attempt: m.Attempt, body: string(m.Delivery.Body), headers: m.Headers}
		if m.Attempt < 3 {
			return errors.New("gateway timeout")
		}
		return nil
	}), fastOpts())
	c := b.start(t, r, nil)
	body := `{"id":"r1","amount":7}`
	b.publish(t, b.queue, body)

	for want := 1; want <= 3; want++ {
		got := testenv.WaitChan(t, calls, "handler call")
		require.Equal(t, want, got.attempt)
		require.Equal(t, body, got.body, "the body never changes")
		if want > 1 {
			require.Equal(t, "error: gateway timeout", got.headers[inboxtype.HeaderError])
			require.Equal(t, b.queue, got.headers[inboxtype.HeaderOriginalQueue])
			require.NotEmpty(t, got.headers[inboxtype.HeaderFirstFailedAt])
		}
		o := b.rec.next(t)
		if want < 3 {
			require.Equal(t, inboxtype.ActionRetried, o.Outcome.Action)
			require.Equal(t, 100*time.Millisecond, o.Outcome.Delay)
		} else {
			require.Equal(t, inboxtype.ActionAcked, o.Outcome.Action)
		}
	}
	b.stop(t, c)
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue))
	require.Equal(t, 0, amqptest.Depth(t, b.conn, inboxtype.RetryQueue(b.queue, 100*time.Millisecond)))
}

// A short delay must not wait behind a long one, and a tier really delays.
func TestConsumer_TiersDelayWithoutHeadOfLineBlocking(t *testing.T) {
	t.Parallel()
	b := setup(t)
	type call struct {
		id      string
		attempt int
		at      time.Time
	}
	calls := make(chan call, 16)
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		calls <- call{id: m.Body.ID, attempt: m.Attempt, at: time.Now()}
		if m.Attempt > 1 {
			return nil
		}
		if m.Body.ID == "slow" {
			return retry.After(3*time.Second, errors.New("come back later"))
		}
		return retry.After(100*time.Millisecond, errors.New("blip"))
	}), fastOpts(100*time.Millisecond, 3*time.Second))
	c := b.start(t, r, nil)
	b.publish(t, b.queue, `{"id":"slow"}`)
	first := testenv.WaitChan(t, calls, "slow first call")
	require.Equal(t, "slow", first.id)
	require.Equal(t, inboxtype.ActionRetried, b.rec.next(t).Outcome.Action)

	b.publish(t, b.queue, `{"id":"fast"}`)
	fastFirst := testenv.WaitChan(t, calls, "fast first call")
	require.Equal(t, "fast", fastFirst.id)
	o := b.rec.next(t)
	require.Equal(t, inboxtype.ActionRetried, o.Outcome.Action)
	require.Equal(t, 100*time.Millisecond, o.Outcome.Delay)

	again := testenv.WaitChan(t, calls, "fast second call")
	require.Equal(t, "fast", again.id, "the 100ms retry overtook the 3s one")
	require.Equal(t, 2, again.attempt)
	require.GreaterOrEqual(t, again.at.Sub(fastFirst.at), 100*time.Millisecond, "the tier delayed the retry")
	require.Equal(t, 1, amqptest.Depth(t, b.conn, inboxtype.RetryQueue(b.queue, 3*time.Second)), "slow still waits in its tier")
	b.stop(t, c)
}

func TestConsumer_PermanentErrorDeadLettersOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error {
		calls.Add(1)
		return retry.Permanent(errors.New("card declined"))
	}), fastOpts())
	c := b.start(t, r, nil)
	b.publish(t, b.queue, `{"id":"p1","amount":5}`)

	o := b.rec.next(t)
	require.Equal(t, inboxtype.ActionDeadLettered, o.Outcome.Action)
	require.Equal(t, retry.KindPermanent, o.Outcome.Decision.Kind)
	b.stop(t, c)

	dead := amqptest.Drain(t, b.conn, b.queue+".dlq")
	require.Len(t, dead, 1)
	require.JSONEq(t, `{"id":"p1","amount":5}`, string(dead[0].Body))
	require.Equal(t, "m-"+`{"id":"p1","amount":5}`, dead[0].MessageId)
	require.Equal(t, "permanent: card declined", dead[0].Headers[inboxtype.HeaderError])
	require.Equal(t, "order:p1", dead[0].Headers[inboxtype.HeaderIdempotencyKey])
	require.Equal(t, b.queue, dead[0].Headers[inboxtype.HeaderOriginalQueue])
	require.Equal(t, 1, inboxtype.HeaderInt(dead[0].Headers, inboxtype.HeaderAttempt))
	require.NotEmpty(t, dead[0].Headers[inboxtype.HeaderLastFailedAt])
	require.Equal(t, int32(1), calls.Load())
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue), "the original was acked")
}

func TestConsumer_MalformedMessagesDeadLetterWithoutHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error {
		calls.Add(1)
		return nil
	}), fastOpts())
	c := b.start(t, r, nil)
	b.publish(t, b.queue, `not json`)
	b.publish(t, b.queue, `{"id":"neg","amount":-1}`)
	for range 2 {
		require.Equal(t, inboxtype.ActionDeadLettered, b.rec.next(t).Outcome.Action)
	}
	b.stop(t, c)

	dead := amqptest.Drain(t, b.conn, b.queue+".dlq")
	require.Len(t, dead, 2)
	reasons := []string{}
	for _, d := range dead {
		e, ok := d.Headers[inboxtype.HeaderError].(string)
		require.True(t, ok)
		reasons = append(reasons, strings.SplitN(e, ":", 2)[0])
	}
	require.ElementsMatch(t, []string{retry.ReasonDecode, retry.ReasonInvalid}, reasons)
	require.Zero(t, calls.Load(), "the handler never saw a malformed payload")
}

func TestConsumer_RetriesExhaustedDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := consumer.NewRouter()
	opts := fastOpts(100 * time.Millisecond)
	opts.Policy = retry.Exponential{InitialInterval: 10 * time.Millisecond, MaxAttempts: 2}
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error {
		return errors.New("still down")
	}), opts)
	c := b.start(t, r, nil)
	b.publish(t, b.queue, `{"id":"x1"}`)

	require.Equal(t, inboxtype.ActionRetried, b.rec.next(t).Outcome.Action)
	o := b.rec.next(t)
	require.Equal(t, inboxtype.ActionDeadLettered, o.Outcome.Action)
	require.Equal(t, retry.ReasonExhausted, o.Outcome.Decision.Reason)
	b.stop(t, c)

	dead := amqptest.Drain(t, b.conn, b.queue+".dlq")
	require.Len(t, dead, 1)
	require.Equal(t, "exhausted: after 2 failed attempts: still down", dead[0].Headers[inboxtype.HeaderError])
	require.Equal(t, 2, inboxtype.HeaderInt(dead[0].Headers, inboxtype.HeaderAttempt))
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue))
}

func TestConsumer_PanicBecomesErrorAndWorkerSurvives(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := consumer.NewRouter()
	opts := fastOpts()
	opts.Queue.Concurrency = 1
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		if m.Body.ID == "boom" && m.Attempt == 1 {
			panic("nil map write")
		}
		return nil
	}), opts)
	c := b.start(t, r, nil)
	b.publish(t, b.queue, `{"id":"boom"}`)
	o := b.rec.next(t)
	require.Equal(t, inboxtype.ActionRetried, o.Outcome.Action)
	require.Equal(t, retry.ReasonPanic, o.Outcome.Decision.Reason)

	b.publish(t, b.queue, `{"id":"after"}`)
	acked := map[string]bool{}
	for range 2 {
		o := b.rec.next(t)
		require.Equal(t, inboxtype.ActionAcked, o.Outcome.Action)
		acked[o.ID] = true
	}
	require.Equal(t, map[string]bool{"boom": true, "after": true}, acked, "the single worker lived on")
	b.stop(t, c)
}

func TestConsumer_GracefulStopLetsInFlightFinish(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan string, 16)
	release := make(chan struct{})
	r := consumer.NewRouter()
	opts := fastOpts()
	opts.Queue.Concurrency, opts.Queue.Prefetch = 2, 10
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		started <- m.Body.ID
		<-release
		return nil
	}), opts)
	c := b.start(t, r, nil)
	for i := range 10 {
		b.publish(t, b.queue, fmt.Sprintf(`{"id":"%d"}`, i))
	}
	testenv.WaitChan(t, started, "first handler")
	testenv.WaitChan(t, started, "second handler")

	stopErr := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
		defer cancel()
		stopErr <- c.Stop(ctx)
	}()
	testenv.WaitFor(t, "basic.cancel", func() bool { return consumers(t, b.conn, b.queue) == 0 })
	select {
	case err := <-stopErr:
		t.Fatalf("Stop returned before in-flight handlers finished: %v", err)
	default:
	}
	require.False(t, c.Ready())
	close(release)
	require.NoError(t, testenv.WaitChan(t, stopErr, "Stop"))

	for range 2 {
		require.Equal(t, inboxtype.ActionAcked, b.rec.next(t).Outcome.Action)
	}
	require.Empty(t, b.rec.outcomes, "nothing else was settled")
	require.Empty(t, started, "no handler started after Stop")
	testenv.WaitFor(t, "8 messages back in the queue", func() bool { return amqptest.Depth(t, b.conn, b.queue) == 8 })
}

func TestConsumer_SoftStopCancelsAndRequeuesWithoutCountingAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan struct{}, 1)
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(ctx context.Context, _ *inboxtype.Message[order]) error {
		started <- struct{}{}
		<-ctx.Done()
		return fmt.Errorf("charge aborted: %w", context.Cause(ctx))
	}), fastOpts())
	c := b.start(t, r, func(cfg *consumer.Config) { cfg.SoftStopTimeout = 50 * time.Millisecond })
	b.publish(t, b.queue, `{"id":"s1"}`)
	testenv.WaitChan(t, started, "handler")
	b.stop(t, c)

	o := b.rec.next(t)
	require.Equal(t, inboxtype.ActionRequeued, o.Outcome.Action)
	require.Equal(t, retry.KindInterrupted, o.Outcome.Decision.Kind)
	require.ErrorIs(t, o.Outcome.Decision.Err, consumer.ErrStopped)

	var m amqp.Delivery
	testenv.WaitFor(t, "the message back in the queue", func() bool {
		var ok bool
		m, ok = amqptest.Get(t, b.conn, b.queue)
		return ok
	})
	require.True(t, m.Redelivered)
	require.NotContains(t, m.Headers, inboxtype.HeaderAttempt, "the attempt was not counted")
	require.Equal(t, 0, amqptest.Depth(t, b.conn, inboxtype.RetryQueue(b.queue, 100*time.Millisecond)))
}

func TestConsumer_StopWithoutStartAndTwice(t *testing.T) {
	t.Parallel()
	r := consumer.NewRouter()
	consumer.Register(r, "never-started", inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error { return nil }), nil)
	c, err := consumer.New(&consumer.Config{URL: testenv.AMQPURL(), Router: r})
	require.NoError(t, err)
	require.NoError(t, c.Stop(t.Context()))
	require.NoError(t, c.Stop(t.Context()))
	testenv.WaitChan(t, c.Stopped(), "stopped")
	require.ErrorIs(t, c.Start(t.Context()), consumer.ErrStopped)
	require.False(t, c.Ready())
}

func TestConsumer_StartFailsClearlyWithoutLeakingPassword(t *testing.T) {
	t.Parallel()
	r := consumer.NewRouter()
	consumer.Register(r, "unreachable", inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error { return nil }), nil)
	c, err := consumer.New(&consumer.Config{URL: "amqp://guest:s3cret-pw@127.0.0.1:1/", Router: r, DialTimeout: time.Second})
	require.NoError(t, err)
	err = c.Start(t.Context())
	require.Error(t, err)
	require.Contains(t, err.Error(), "127.0.0.1:1")
	require.NotContains(t, err.Error(), "s3cret-pw")
	require.NoError(t, c.Stop(t.Context()))
}

// The test hooks let a test kill the connection between commit and ack:
// the delivery is not acked on the dead channel but redelivered.
func TestConsumer_ConnectionLostBeforeAckRedelivers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, _ *inboxtype.Message[order]) error {
		calls.Add(1)
		return nil
	}), fastOpts())
	c := b.newConsumer(t, r, nil)
	var once sync.Once
	consumer.SetTestHooks(c, func(d *inboxtype.Delivery) {
		once.Do(func() {
			ch, ok := d.Raw.Acknowledger.(*amqp.Channel)
			require.True(t, ok)
			_ = ch.Close() // the "crash" between commit and ack
		})
	}, nil)
	require.NoError(t, c.Start(t.Context()))
	b.publish(t, b.queue, `{"id":"k1"}`)

	first := b.rec.next(t)
	require.Equal(t, inboxtype.ActionAbandoned, first.Outcome.Action)
	second := b.rec.next(t)
	require.Equal(t, inboxtype.ActionAcked, second.Outcome.Action)
	require.Equal(t, int32(2), calls.Load(), "redelivered after the lost ack (the inbox turns it into a duplicate)")
	b.stop(t, c)
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue))
}

func TestConsumer_ConnectionLostAfterRetryPublishBeforeAck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := consumer.NewRouter()
	var calls atomic.Int32
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		calls.Add(1)
		if m.Attempt == 1 {
			return errors.New("blip")
		}
		return nil
	}), fastOpts())
	c := b.newConsumer(t, r, nil)
	var once sync.Once
	consumer.SetTestHooks(c, nil, func(d *inboxtype.Delivery) {
		once.Do(func() {
			ch, ok := d.Raw.Acknowledger.(*amqp.Channel)
			require.True(t, ok)
			_ = ch.Close()
		})
	})
	require.NoError(t, c.Start(t.Context()))
	b.publish(t, b.queue, `{"id":"k2"}`)

	require.Equal(t, inboxtype.ActionAbandoned, b.rec.next(t).Outcome.Action, "the copy exists but the original was not acked")
	// Both the redelivered original and the confirmed copy arrive: at least
	// once, never lost.
	acked := 0
	for acked < 1 {
		if o := b.rec.next(t); o.Outcome.Action == inboxtype.ActionAcked {
			acked++
		}
	}
	b.stop(t, c)
	require.GreaterOrEqual(t, calls.Load(), int32(2))
}

func TestConsumer_InProcessRetryAbsorbsBlips(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	r := consumer.NewRouter()
	opts := fastOpts()
	opts.InProcess = retry.InProcess{Tries: 2, InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond}
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		if calls.Add(1) < 3 {
			return errors.New("serialization failure")
		}
		require.Equal(t, 1, m.Attempt, "in-process tries are one broker attempt")
		return nil
	}), opts)
	c := b.start(t, r, nil)
	b.publish(t, b.queue, `{"id":"blip"}`)
	o := b.rec.next(t)
	require.Equal(t, inboxtype.ActionAcked, o.Outcome.Action)
	require.Equal(t, 2, o.Outcome.InProcessRetries)
	require.Equal(t, int32(2), b.rec.inProc.Load())
	require.Equal(t, int32(3), calls.Load())
	b.stop(t, c)
	require.Equal(t, 0, amqptest.Depth(t, b.conn, inboxtype.RetryQueue(b.queue, 100*time.Millisecond)))
}
