package middleware_test

import (
	"context"
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/middleware"
	"github.com/inboxmq/inboxmq/retry"
)

type traceBundle struct {
	tp  *sdktrace.TracerProvider
	rec *tracetest.SpanRecorder
}

func setupTrace(t *testing.T) *traceBundle {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &traceBundle{tp: tp, rec: rec}
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// runAndSettle runs h on d outside a consumer and then settles d by hand,
// with the decision a consumer would settle on, as the consumer does once
// the chain has returned: that ends the span and makes the observations.
func runAndSettle(h inboxtype.DeliveryHandler, d *inboxtype.Delivery) error {
	ctx := context.Background()
	err := h(ctx, d)
	d.Settle(inboxtype.Outcome{Decision: consumer.Decide(ctx, err)})
	return err
}

// publish starts a producer span and returns the headers a publisher would
// send, with its trace context injected.
func publish(t *testing.T, tp trace.TracerProvider) (amqp.Table, trace.SpanContext) {
	t.Helper()
	ctx, span := tp.Tracer("producer").Start(context.Background(), "send payments")
	defer span.End()
	h := middleware.InjectHeaders(ctx, amqp.Table{inboxtype.HeaderAttempt: int32(2)})
	require.Contains(t, h, "traceparent")
	return h, span.SpanContext()
}

func TestTracing_ParentFromHeaders(t *testing.T) {
	t.Parallel()
	b := setupTrace(t)
	headers, parent := publish(t, b.tp)

	d := inboxtype.NewDelivery("payments", "payments-svc", "w1", &amqp.Delivery{
		MessageId: "msg-1", Headers: headers, Body: []byte(`{"order":"42"}`), RoutingKey: "payments", DeliveryTag: 9,
	})
	var handlerSpan trace.SpanContext
	h := middleware.Tracing(b.tp, nil)(func(ctx context.Context, d *inboxtype.Delivery) error {
		handlerSpan = trace.SpanContextFromContext(ctx)
		d.Key = "payment:42"
		d.LockKey = "lock:payment:42"
		d.LockFence = 2
		d.InboxFence = 3
		return nil
	})
	require.NoError(t, h(context.Background(), d))
	require.Len(t, b.rec.Ended(), 1, "only the producer's: the span ends when the delivery is settled")
	d.Settle(inboxtype.Outcome{Decision: consumer.Decide(context.Background(), nil), Action: inboxtype.ActionAcked})

	spans := b.rec.Ended()
	var got sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == "process payments" {
			got = s
		}
	}
	require.NotNil(t, got)
	require.Equal(t, parent.TraceID(), got.SpanContext().TraceID(), "same trace as the publisher")
	require.Equal(t, parent.SpanID(), got.Parent().SpanID(), "the publisher's span is the parent")
	require.True(t, got.Parent().IsRemote())
	require.Equal(t, got.SpanContext().SpanID(), handlerSpan.SpanID(), "the handler's ctx carries the span")
	require.Equal(t, trace.SpanKindConsumer, got.SpanKind())
	require.Equal(t, codes.Unset, got.Status().Code)

	a := attrs(got)
	require.Equal(t, "rabbitmq", a["messaging.system"].AsString())
	require.Equal(t, "payments", a["messaging.destination.name"].AsString())
	require.Equal(t, "msg-1", a["messaging.message.id"].AsString())
	require.Equal(t, "process", a["messaging.operation"].AsString())
	require.Equal(t, "payments-svc", a["messaging.consumer.group.name"].AsString())
	require.Equal(t, "payments", a["messaging.rabbitmq.destination.routing_key"].AsString())
	require.Equal(t, int64(9), a["messaging.rabbitmq.message.delivery_tag"].AsInt64())
	require.Equal(t, "payment:42", a["inboxmq.idempotency_key"].AsString())
	require.Equal(t, int64(2), a["inboxmq.attempt"].AsInt64())
	require.Equal(t, "lock:payment:42", a["inboxmq.lock_key"].AsString())
	require.Equal(t, int64(2), a["inboxmq.lock_fence"].AsInt64())
	require.Equal(t, int64(3), a["inboxmq.fence"].AsInt64(), "inboxmq.fence is the inbox fence")
	require.Equal(t, "succeeded", a["inboxmq.outcome"].AsString())
	require.Equal(t, "acked", a["inboxmq.action"].AsString())
}

func TestTracing_ErrorRecorded(t *testing.T) {
	t.Parallel()
	b := setupTrace(t)
	d := inboxtype.NewDelivery("payments", "payments-svc", "w1", &amqp.Delivery{MessageId: "m"})
	boom := retry.WithReason("db_deadlock", errors.New("deadlock detected"))
	err := runAndSettle(middleware.Tracing(b.tp, nil)(func(context.Context, *inboxtype.Delivery) error { return boom }), d)
	require.ErrorIs(t, err, boom)

	spans := b.rec.Ended()
	require.Len(t, spans, 1)
	s := spans[0]
	require.False(t, s.Parent().IsValid(), "no headers: a new trace")
	require.Equal(t, codes.Error, s.Status().Code)
	require.Equal(t, "deadlock detected", s.Status().Description)
	require.Len(t, s.Events(), 1)
	require.Equal(t, "exception", s.Events()[0].Name)
	a := attrs(s)
	require.Equal(t, "retry", a["inboxmq.outcome"].AsString())
	require.Equal(t, "db_deadlock", a["inboxmq.reason"].AsString())
}

func TestTracing_DuplicateIsNotAnError(t *testing.T) {
	t.Parallel()
	b := setupTrace(t)
	d := inboxtype.NewDelivery("payments", "payments-svc", "w1", &amqp.Delivery{})
	off := false
	mw := middleware.Tracing(b.tp, &middleware.TracingOpts{IdempotencyKeyAttribute: &off})
	err := runAndSettle(mw(func(_ context.Context, d *inboxtype.Delivery) error {
		d.Key = "secret:42"
		return retry.Duplicate(retry.SourceCache, nil)
	}), d)
	require.ErrorIs(t, err, retry.ErrDuplicate)
	s := b.rec.Ended()[0]
	require.Equal(t, codes.Unset, s.Status().Code)
	a := attrs(s)
	require.Equal(t, "duplicate", a["inboxmq.outcome"].AsString())
	require.Equal(t, "cache", a["inboxmq.duplicate_source"].AsString())
	require.NotContains(t, a, attribute.Key("inboxmq.idempotency_key"))
}

func TestHeaderCarrier(t *testing.T) {
	t.Parallel()
	c := middleware.HeaderCarrier(amqp.Table{"traceparent": []byte("00-abc"), "n": int32(1)})
	require.Equal(t, "00-abc", c.Get("traceparent"))
	require.Empty(t, c.Get("n"))
	require.Empty(t, c.Get("missing"))
	c.Set("tracestate", "k=v")
	require.Equal(t, "k=v", c.Get("tracestate"))
	require.ElementsMatch(t, []string{"traceparent", "n", "tracestate"}, c.Keys())

	require.Empty(t, middleware.InjectHeaders(context.Background(), nil), "no span, nothing written")
}

func BenchmarkTracing_NoopProvider(b *testing.B) {
	mw := middleware.Tracing(nil, nil)(func(context.Context, *inboxtype.Delivery) error { return nil })
	d := inboxtype.NewDelivery("payments", "payments-svc", "w1", &amqp.Delivery{MessageId: "m"})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_ = mw(ctx, d)
		d.Settle(inboxtype.Outcome{})
	}
}

func TestTracing_RetryCopyLinksToTheFailedAttempt(t *testing.T) {
	t.Parallel()
	b := setupTrace(t)
	headers, parent := publish(t, b.tp)
	mw := middleware.Tracing(b.tp, nil)

	first := inboxtype.NewDelivery("payments", "payments-svc", "w1", &amqp.Delivery{Headers: headers})
	boom := errors.New("gateway timeout")
	require.ErrorIs(t, runAndSettle(mw(func(context.Context, *inboxtype.Delivery) error { return boom }), first), boom)
	failed := b.rec.Ended()[len(b.rec.Ended())-1]
	require.Equal(t, "process payments", failed.Name())

	// The consumer's copy: the delivery's headers, then CopyHeaders.
	require.Contains(t, first.CopyHeaders, inboxtype.HeaderFailedTraceparent)
	copied := amqp.Table{}
	for k, v := range headers {
		copied[k] = v
	}
	for k, v := range first.CopyHeaders {
		copied[k] = v
	}
	copied[inboxtype.HeaderAttempt] = int32(3)
	second := inboxtype.NewDelivery("payments", "payments-svc", "w1", &amqp.Delivery{Headers: copied})
	require.NoError(t, runAndSettle(mw(func(context.Context, *inboxtype.Delivery) error { return nil }), second))
	retried := b.rec.Ended()[len(b.rec.Ended())-1]

	require.Equal(t, parent.SpanID(), retried.Parent().SpanID(), "the retry stays the producer's child")
	require.Len(t, retried.Links(), 1)
	link := retried.Links()[0]
	require.Equal(t, failed.SpanContext().TraceID(), link.SpanContext.TraceID())
	require.Equal(t, failed.SpanContext().SpanID(), link.SpanContext.SpanID(), "linked to the attempt that failed")
	require.Equal(t, []attribute.KeyValue{attribute.String("inboxmq.link", "failed_attempt")}, link.Attributes)
	require.Equal(t, int64(3), attrs(retried)["inboxmq.attempt"].AsInt64())
	require.Empty(t, failed.Links(), "a first attempt links to nothing")
}

func TestTracing_NotRecordingAddsNothing(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.NeverSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	headers, parent := publish(t, tp)

	d := inboxtype.NewDelivery("payments", "payments-svc", "w1", &amqp.Delivery{Headers: headers})
	var inCtx trace.SpanContext
	err := runAndSettle(middleware.Tracing(tp, nil)(func(ctx context.Context, _ *inboxtype.Delivery) error {
		inCtx = trace.SpanContextFromContext(ctx)
		return errors.New("boom")
	}), d)
	require.Error(t, err)
	require.Empty(t, rec.Ended())
	require.Nil(t, d.CopyHeaders, "no span, no link for the copy")
	require.Equal(t, parent.TraceID(), inCtx.TraceID(), "the trace context still reaches the handler")
}

func BenchmarkTracing_NoopPackageProvider(b *testing.B) {
	mw := middleware.Tracing(noop.NewTracerProvider(), nil)(func(context.Context, *inboxtype.Delivery) error { return nil })
	d := inboxtype.NewDelivery("payments", "payments-svc", "w1", &amqp.Delivery{MessageId: "m"})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_ = mw(ctx, d)
		d.Settle(inboxtype.Outcome{})
	}
}
