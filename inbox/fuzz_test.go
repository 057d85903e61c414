package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/middleware"
	"github.com/inboxmq/inboxmq/retry"
)

// FuzzMapError maps arbitrary PostgreSQL errors (any SQLSTATE, wrapped or
// already classified) into the retry taxonomy: never a panic, nil stays
// nil, the documented codes get their decision, and an already-classified
// error keeps its decision.
func FuzzMapError(f *testing.F) {
	for _, c := range []string{"40001", "40P01", "57P01", "53300", "08006", "57014", "55P03", "25006", "23505", "23503", "22021", "22P02", "23502", "42P01", "XX000", "", "0", "08"} {
		f.Add(c, "boom", uint8(0))
	}
	f.Add("40001", "wrapped", uint8(1))
	f.Add("23505", "permanent", uint8(2))
	f.Add("40001", "duplicate", uint8(3))
	f.Fuzz(func(t *testing.T, code, msg string, wrap uint8) {
		if inbox.MapError(nil) != nil {
			t.Fatal("MapError(nil) != nil")
		}
		var err error = &pgconn.PgError{Code: code, Message: msg}
		switch wrap % 5 {
		case 1:
			err = fmt.Errorf("handler: %w", err)
		case 2:
			err = retry.Permanent(err)
		case 3:
			err = retry.Duplicate(retry.SourceCache, err)
		case 4:
			err = errors.Join(errors.New(msg), err)
		}
		before := retry.Classify(err)
		mapped := inbox.MapError(err)
		if mapped == nil {
			t.Fatalf("MapError(%v) = nil", err)
		}
		if !errors.Is(mapped, err) {
			t.Fatalf("MapError lost the original error: %v", mapped)
		}
		dec := retry.Classify(mapped)
		if wrap%5 == 2 || wrap%5 == 3 {
			if dec.Kind != before.Kind {
				t.Fatalf("classified error changed from %s to %s", before.Kind, dec.Kind)
			}
			return
		}
		var want retry.Kind
		switch {
		case code == "23505":
			want = retry.KindDuplicate
		case len(code) == 5 && (code[:2] == "22" || code[:2] == "23"):
			want = retry.KindPermanent
		case code == "40001", code == "40P01", code == "57P01", code == "57P02", code == "57P03", code == "53300",
			len(code) == 5 && code[:2] == "08", code == "57014", code == "55P03", code == "25006":
			want = retry.KindRetry
		default:
			want = before.Kind // passes through unchanged (the policy bounds it)
		}
		if dec.Kind != want {
			t.Fatalf("SQLSTATE %q: %s, want %s", code, dec.Kind, want)
		}
	})
}

type tracedJob struct {
	ID string `json:"id"`
}

func (j tracedJob) IdempotencyKey() string { return "job:" + j.ID }

// FuzzTraceHeaders feeds arbitrary trace-context headers (traceparent,
// tracestate, as text, bytes or other types) through the tracing middleware
// in front of a registered handler: never a panic, and a malformed trace
// context never keeps the job from its handler.
func FuzzTraceHeaders(f *testing.F) {
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "congo=t61rcWkgMzE", uint8(0))
	f.Add("00-00000000000000000000000000000000-0000000000000000-00", "", uint8(1))
	f.Add("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "a=b,c=d", uint8(0))
	f.Add("garbage", "=,=,", uint8(2))
	f.Add("", "", uint8(3))
	tp := sdktrace.NewTracerProvider()
	f.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	f.Fuzz(func(t *testing.T, parent, state string, kind uint8) {
		r := consumer.NewRouter()
		r.Use(middleware.Tracing(tp, nil))
		handled := false
		var span trace.SpanContext
		consumer.Register(r, "fuzz", inboxtype.HandlerFunc[tracedJob](func(ctx context.Context, _ *inboxtype.Message[tracedJob]) error {
			handled = true
			span = trace.SpanContextFromContext(ctx)
			return nil
		}), nil)
		h := amqp.Table{}
		switch kind % 4 {
		case 0:
			h["traceparent"], h["tracestate"] = parent, state
		case 1:
			h["traceparent"], h["tracestate"] = []byte(parent), []byte(state)
		case 2:
			h["traceparent"], h["tracestate"] = int32(len(parent)), amqp.Table{"x": state}
		}
		route := r.Routes()[0]
		d := inboxtype.NewDelivery("fuzz", route.Opts.Namespace, "fuzz", &amqp.Delivery{Body: []byte(`{"id":"1"}`), Headers: h})
		if err := route.Handler(context.Background(), d); err != nil {
			t.Fatalf("headers %v: %v", h, err)
		}
		if !handled {
			t.Fatalf("headers %v kept the job from its handler", h)
		}
		if !span.IsValid() {
			t.Fatalf("headers %v: the handler ran without a valid span", h)
		}
	})
}
