package middleware_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/metrics"
	"github.com/inboxmq/inboxmq/internal/middleware"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// settledBundle is one consumer-level test of Tracing and Metrics: a route
// on its own queue behind Tracing and Metrics, and a probe outside them
// that counts the runs whose span had ended when the chain returned.
type settledBundle struct {
	queue      string
	trace      *traceBundle
	reg        *prometheus.Registry
	outcomes   chan inboxtype.Outcome
	runs       atomic.Int32
	endedEarly atomic.Int32
}

func setupSettled(t *testing.T, h inboxtype.Handler[tracedOrder], opts *consumer.HandlerOpts) *settledBundle {
	t.Helper()
	b := &settledBundle{
		queue:    amqptest.QueueName(t),
		trace:    setupTrace(t),
		reg:      prometheus.NewPedanticRegistry(),
		outcomes: make(chan inboxtype.Outcome, 16),
	}
	m, err := metrics.New(b.reg, nil)
	require.NoError(t, err)
	probe := func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
		return func(ctx context.Context, d *inboxtype.Delivery) error {
			err := next(ctx, d)
			// Only the spans of earlier runs may have ended.
			if n := b.runs.Add(1); len(b.spans()) >= int(n) {
				b.endedEarly.Add(1)
			}
			return err
		}
	}
	r := consumer.NewRouter()
	r.Use(probe, middleware.Tracing(b.trace.tp, nil))
	consumer.Register(r, b.queue, h, opts)
	c, err := consumer.New(&consumer.Config{
		URL:       testenv.AMQPURL(),
		Router:    r,
		Observers: []inboxtype.Observer{m, &outcomes{ch: b.outcomes}},
	})
	require.NoError(t, err)
	require.NoError(t, c.Start(t.Context()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
	})
	amqptest.NewPublisher(t, amqptest.Dial(t)).Publish(b.queue, []byte(`{"id":"s1"}`), amqp.Publishing{MessageId: "m1"})
	return b
}

// outcomes sends every outcome the consumer reports to ch.
type outcomes struct {
	inboxtype.NopObserver
	ch chan inboxtype.Outcome
}

func (o *outcomes) OnOutcome(_ *inboxtype.Delivery, out inboxtype.Outcome) { o.ch <- out }

// waitAction waits for the next outcome with action want.
func waitAction(t *testing.T, ch <-chan inboxtype.Outcome, want inboxtype.Action) inboxtype.Outcome {
	t.Helper()
	for {
		o := testenv.WaitChan(t, ch, "outcome "+string(want))
		if o.Action == want {
			return o
		}
	}
}

// spans returns the ended consumer spans of the bundle's queue.
func (b *settledBundle) spans() []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range b.trace.rec.Ended() {
		if s.Name() == "process "+b.queue {
			out = append(out, s)
		}
	}
	return out
}

// handlerKinds returns the handler_duration_seconds sample count per kind.
func (b *settledBundle) handlerKinds(t *testing.T) map[string]uint64 {
	t.Helper()
	mfs, err := b.reg.Gather()
	require.NoError(t, err)
	counts := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "inboxmq_handler_duration_seconds" {
			continue
		}
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "kind" {
					counts[l.GetValue()] += s.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return counts
}

var errCardDeclined = errors.New("card declined")

// A route whose Rule makes an error permanent is settled, traced and
// counted alike: the span says permanent with the rule's reason and
// dead_lettered, the histogram counts kind permanent, never retry.
func TestTracing_CustomRuleIsTracedAndCountedAsSettled(t *testing.T) {
	t.Parallel()
	opts := &consumer.HandlerOpts{
		Rules: []retry.Rule{func(err error) (retry.Decision, bool) {
			if errors.Is(err, errCardDeclined) {
				return retry.Decision{Kind: retry.KindPermanent, Reason: "card_declined"}, true
			}
			return retry.Decision{}, false
		}},
		InProcess: retry.InProcess{Tries: -1},
	}
	b := setupSettled(t, inboxtype.HandlerFunc[tracedOrder](func(context.Context, *inboxtype.Message[tracedOrder]) error {
		return errCardDeclined
	}), opts)

	out := waitAction(t, b.outcomes, inboxtype.ActionDeadLettered)
	require.Equal(t, "card_declined", out.Decision.Reason)
	spans := b.spans()
	require.Len(t, spans, 1)
	a := attrs(spans[0])
	require.Equal(t, "permanent", a["inboxmq.outcome"].AsString())
	require.Equal(t, "card_declined", a["inboxmq.reason"].AsString())
	require.Equal(t, "dead_lettered", a["inboxmq.action"].AsString())
	require.Equal(t, codes.Error, spans[0].Status().Code)
	require.Equal(t, "card declined", spans[0].Status().Description)
	require.Equal(t, map[string]uint64{"permanent": 1}, b.handlerKinds(t))
	require.Zero(t, b.endedEarly.Load(), "the span ends at settlement, after the chain returned")
}

// After the last attempt the delivery is dead-lettered for exhaustion: the
// span says so, though the error itself classifies as a retry.
func TestTracing_ExhaustedDeadLetterIsTracedAsSettled(t *testing.T) {
	t.Parallel()
	opts := &consumer.HandlerOpts{
		Policy:    retry.Exponential{InitialInterval: 10 * time.Millisecond, MaxAttempts: 1},
		InProcess: retry.InProcess{Tries: -1},
	}
	b := setupSettled(t, inboxtype.HandlerFunc[tracedOrder](func(context.Context, *inboxtype.Message[tracedOrder]) error {
		return errors.New("gateway timeout")
	}), opts)

	waitAction(t, b.outcomes, inboxtype.ActionDeadLettered)
	spans := b.spans()
	require.Len(t, spans, 1)
	a := attrs(spans[0])
	require.Equal(t, "dead_lettered", a["inboxmq.action"].AsString())
	require.Equal(t, retry.ReasonExhausted, a["inboxmq.reason"].AsString())
	require.Equal(t, codes.Error, spans[0].Status().Code)
	require.Equal(t, map[string]uint64{"retry": 1}, b.handlerKinds(t), "the decision's kind; the reason says exhausted")
}

// Each run of the chain has one span, ended once, at the consumer's
// decision on that run: the in-process try when the next try starts, the
// last at settlement. Every span that started has ended by the time the
// observers hear of the outcome.
func TestTracing_EachRunEndsOnceAtItsDecision(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	opts := &consumer.HandlerOpts{
		InProcess: retry.InProcess{Tries: 2, InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond},
	}
	b := setupSettled(t, inboxtype.HandlerFunc[tracedOrder](func(context.Context, *inboxtype.Message[tracedOrder]) error {
		if calls.Add(1) == 1 {
			return retry.WithReason("blip", errors.New("serialization failure"))
		}
		return nil
	}), opts)

	out := waitAction(t, b.outcomes, inboxtype.ActionAcked)
	require.Equal(t, 1, out.InProcessRetries)
	spans := b.spans()
	require.Len(t, spans, 2, "one span per run")
	var started int
	for _, s := range b.trace.rec.Started() {
		if s.Name() == "process "+b.queue {
			started++
		}
	}
	require.Equal(t, 2, started, "no span left open or started twice")
	first, last := attrs(spans[0]), attrs(spans[1])
	require.Equal(t, "retried_in_process", first["inboxmq.action"].AsString())
	require.Equal(t, "blip", first["inboxmq.reason"].AsString())
	require.Equal(t, int64(0), first["inboxmq.in_process_retries"].AsInt64())
	require.Equal(t, "acked", last["inboxmq.action"].AsString())
	require.Equal(t, "succeeded", last["inboxmq.outcome"].AsString())
	require.Equal(t, int64(1), last["inboxmq.in_process_retries"].AsInt64())
	require.Equal(t, codes.Unset, spans[1].Status().Code)
	require.Equal(t, map[string]uint64{"succeeded": 1}, b.handlerKinds(t), "one observation per delivery: its last run")
	require.Zero(t, b.endedEarly.Load())
}
