package inbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

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

// A BatchHandler delivery has its handler's span and the span of its one
// round trip, alone and in a group, each a child of the delivery's.
func TestBatchHandler_ChildSpans(t *testing.T) {
	t.Parallel()
	for name, opts := range map[string]*inbox.GroupCommit{"alone": nil, "group": fullBatch(2)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			h := inbox.BatchHandler(b.store, batchEffects(nil, nil), opts)

			n := 1
			if opts != nil {
				n = 2
			}
			msgs := orders(t, n)
			parents := make([]trace.Span, n)
			errs := make(chan error, n)
			for i, m := range msgs {
				ctx, parent := tp.Tracer("test").Start(t.Context(), "consume")
				parents[i] = parent
				go func() { errs <- h.Handle(ctx, m) }()
			}
			for range msgs {
				require.NoError(t, <-errs)
			}
			for _, p := range parents {
				names := map[string]bool{}
				for _, s := range rec.Ended() {
					if s.Parent().SpanID() == p.SpanContext().SpanID() {
						names[s.Name()] = true
					}
				}
				require.Equal(t, map[string]bool{"inbox.handler": true, "inbox.batch": true}, names)
			}
		})
	}
}
