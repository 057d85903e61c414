package inbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
)

func TestHandler_ChildSpans(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	ctx, parent := tp.Tracer("test").Start(t.Context(), "consume")
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error { return nil }, nil)
	require.NoError(t, h.Handle(ctx, newMsg(t, "payments", order{OrderID: "span"}, false)))
	parent.End()

	names := map[string]bool{}
	for _, s := range rec.Ended() {
		if s.Name() == "consume" {
			continue
		}
		names[s.Name()] = true
		require.Equal(t, parent.SpanContext().TraceID(), s.SpanContext().TraceID())
		require.Equal(t, parent.SpanContext().SpanID(), s.Parent().SpanID())
	}
	require.Equal(t, map[string]bool{"inbox.claim": true, "inbox.handler": true, "inbox.commit": true}, names)
}
