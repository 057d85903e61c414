package middleware_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/middleware"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

type tracedOrder struct {
	ID string `json:"id"`
}

func (o tracedOrder) IdempotencyKey() string { return "order:" + o.ID }

// Through the real consumer and broker: the trace context a producer
// published is the parent of the consumer span of the first attempt and,
// carried on the retry copy's headers, of the retried attempt's span too.
func TestTracing_ContextSurvivesABrokerRetry(t *testing.T) {
	t.Parallel()
	b := setupTrace(t)
	headers, parent := publish(t, b.tp)
	delete(headers, inboxtype.HeaderAttempt)

	conn := amqptest.Dial(t)
	queue := amqptest.QueueName(t)
	attempts := make(chan int, 4)
	r := consumer.NewRouter()
	r.Use(middleware.Tracing(b.tp, nil))
	consumer.Register(r, queue, inboxtype.HandlerFunc[tracedOrder](func(_ context.Context, m *inboxtype.Message[tracedOrder]) error {
		attempts <- m.Attempt
		if m.Attempt == 1 {
			return errors.New("gateway timeout")
		}
		return nil
	}), &consumer.HandlerOpts{
		Policy:    retry.Exponential{InitialInterval: 10 * time.Millisecond, MaxAttempts: 3},
		InProcess: retry.InProcess{Tries: -1},
		Queue:     consumer.QueueOpts{Concurrency: 1, RetryTiers: []time.Duration{50 * time.Millisecond}},
	})
	c, err := consumer.New(&consumer.Config{URL: testenv.AMQPURL(), Router: r})
	require.NoError(t, err)
	require.NoError(t, c.Start(t.Context()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
	})
	amqptest.NewPublisher(t, conn).Publish(queue, []byte(`{"id":"t1"}`), amqp.Publishing{MessageId: "m1", Headers: headers})

	require.Equal(t, 1, testenv.WaitChan(t, attempts, "first attempt"))
	require.Equal(t, 2, testenv.WaitChan(t, attempts, "retried attempt"))
	testenv.WaitFor(t, "two consumer spans ended", func() bool {
		n := 0
		for _, s := range b.rec.Ended() {
			if s.Name() == "process "+queue {
				n++
			}
		}
		return n == 2
	})
	for _, s := range b.rec.Ended() {
		if s.Name() != "process "+queue {
			continue
		}
		require.Equal(t, parent.TraceID(), s.SpanContext().TraceID(), "same trace on every attempt")
		require.Equal(t, parent.SpanID(), s.Parent().SpanID(), "the producer's span is the parent of every attempt")
	}
	// The retry copy carried the failed attempt's context: the second span
	// links to the first.
	byAttempt := map[int64]sdktrace.ReadOnlySpan{}
	for _, s := range b.rec.Ended() {
		if s.Name() == "process "+queue {
			byAttempt[attrs(s)["inboxmq.attempt"].AsInt64()] = s
		}
	}
	require.Len(t, byAttempt[2].Links(), 1)
	require.Equal(t, byAttempt[1].SpanContext().SpanID(), byAttempt[2].Links()[0].SpanContext.SpanID())
}

// A dead letter carries the failed attempt's trace context next to the
// producer's: a replay of it links back to the attempt that gave up.
func TestTracing_DeadLetterCarriesTheFailedAttempt(t *testing.T) {
	t.Parallel()
	b := setupTrace(t)
	headers, parent := publish(t, b.tp)
	delete(headers, inboxtype.HeaderAttempt)

	conn := amqptest.Dial(t)
	queue := amqptest.QueueName(t)
	r := consumer.NewRouter()
	r.Use(middleware.Tracing(b.tp, nil))
	consumer.Register(r, queue, inboxtype.HandlerFunc[tracedOrder](func(context.Context, *inboxtype.Message[tracedOrder]) error {
		return retry.Permanent(errors.New("card declined"))
	}), &consumer.HandlerOpts{Queue: consumer.QueueOpts{Concurrency: 1}})
	c, err := consumer.New(&consumer.Config{URL: testenv.AMQPURL(), Router: r})
	require.NoError(t, err)
	require.NoError(t, c.Start(t.Context()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
	})
	amqptest.NewPublisher(t, conn).Publish(queue, []byte(`{"id":"d1"}`), amqp.Publishing{MessageId: "m1", Headers: headers})

	testenv.WaitFor(t, "the dead letter", func() bool { return amqptest.Depth(t, conn, queue+".dlq") == 1 })
	dead, ok := amqptest.Get(t, conn, queue+".dlq")
	require.True(t, ok)
	var failed sdktrace.ReadOnlySpan
	testenv.WaitFor(t, "the consumer span ended", func() bool {
		for _, s := range b.rec.Ended() {
			if s.Name() == "process "+queue {
				failed = s
				return true
			}
		}
		return false
	})
	require.Equal(t, "dead_lettered", attrs(failed)["inboxmq.action"].AsString())
	require.Equal(t, parent.SpanID(), spanIDOf(t, dead.Headers, "traceparent"), "the producer's context stays")
	require.Equal(t, failed.SpanContext().SpanID(), spanIDOf(t, dead.Headers, inboxtype.HeaderFailedTraceparent), "the failed attempt's context travels with it")
}

// spanIDOf parses the span id of the W3C traceparent in header name.
func spanIDOf(t *testing.T, h amqp.Table, name string) trace.SpanID {
	t.Helper()
	v, _ := h[name].(string)
	parts := strings.Split(v, "-")
	require.Len(t, parts, 4, "%s: %q", name, v)
	id, err := trace.SpanIDFromHex(parts[2])
	require.NoError(t, err)
	return id
}
