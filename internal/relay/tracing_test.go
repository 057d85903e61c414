package relay

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/envelope"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/outbox"
)

func TestRelayPublishSpanCarriesItsContextToTheMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	r, _ := b.newRelay(t, &Config{TracerProvider: tp})

	// The handler's span: Enqueue stores its context with the row.
	ctx, handler := tp.Tracer("test").Start(t.Context(), "process orders")
	msg := msgTo(b.queue, "traced")
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return outbox.Enqueue(ctx, tx, msg) }))
	handler.End()

	start(t, r)
	waitAllSent(t, b.pool, 1)
	got := amqptest.Drain(t, b.conn, b.queue)
	require.Len(t, got, 1)

	var publish sdktrace.ReadOnlySpan
	testenv.WaitFor(t, "the publish span ended", func() bool {
		for _, s := range rec.Ended() {
			if s.Name() == "publish "+b.queue {
				publish = s
				return true
			}
		}
		return false
	})
	require.Equal(t, trace.SpanKindProducer, publish.SpanKind())
	require.Equal(t, handler.SpanContext().SpanID(), publish.Parent().SpanID(), "the enqueuing span is the parent")
	require.Equal(t, codes.Unset, publish.Status().Code)
	a := map[attribute.Key]string{}
	for _, kv := range publish.Attributes() {
		a[kv.Key] = kv.Value.String()
	}
	require.Equal(t, "rabbitmq", a["messaging.system"])
	require.Equal(t, "send", a["messaging.operation.type"])
	require.Equal(t, got[0].MessageId, a["messaging.message.id"])

	sent := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), envelope.Carrier(got[0].Headers)))
	require.Equal(t, publish.SpanContext().SpanID(), sent.SpanID(), "the message carries the publish span's context")
	require.Equal(t, handler.SpanContext().TraceID(), sent.TraceID())
}
