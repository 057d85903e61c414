package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	amqp "github.com/rabbitmq/amqp091-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/middleware"
	"github.com/inboxmq/inboxmq/retry"
)

// ExampleNewLogObserver writes one JSON line per transition. The consumer
// calls the observer; here a duplicate's outcome is reported by hand. Any
// slog handler works: slog's own JSON handler here, zap's through zapslog
// in examples/payment-worker.
func ExampleNewLogObserver() {
	logger := slog.New(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{} // stable output for the example
			}
			return a
		},
	}))
	obs := middleware.NewLogObserver(logger, nil)

	d := inboxtype.NewDelivery("payments", "payments", "worker-1", &amqp.Delivery{MessageId: "m-1", Redelivered: true})
	d.Key = "payment:order-42"
	obs.OnOutcome(d, inboxtype.Outcome{Action: inboxtype.ActionAcked, Decision: retry.Classify(retry.Duplicate(retry.SourceInbox, nil))})
	// Output:
	// {"level":"INFO","msg":"delivery duplicate","status":"duplicate","message_id":"m-1","idempotency_key":"payment:order-42","consumer":"payments","queue":"payments","worker_id":"worker-1","attempt":1,"redelivered":true,"duration":0,"duplicate_source":"inbox","error":"retry: duplicate message (inbox)"}
}

// ExampleTracing joins the publisher's trace: the producer injects its span
// into the headers and the consumer span becomes its child.
func ExampleTracing() {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	// Publisher side.
	ctx, send := tp.Tracer("producer").Start(context.Background(), "send payments")
	headers := middleware.InjectHeaders(ctx, nil)
	send.End()

	// Consumer side.
	handler := middleware.Tracing(tp, nil)(func(context.Context, *inboxtype.Delivery) error {
		return retry.Permanent(errors.New("card declined"))
	})
	d := inboxtype.NewDelivery("payments", "payments", "worker-1", &amqp.Delivery{Headers: headers})
	err := handler(context.Background(), d)
	// The consumer settles the delivery, which ends the span with the
	// outcome; here it is settled by hand.
	d.Settle(inboxtype.Outcome{Decision: consumer.Decide(context.Background(), err), Action: inboxtype.ActionDeadLettered})

	spans := rec.Ended()
	process := spans[len(spans)-1]
	fmt.Println(process.Name())
	fmt.Println(process.Parent().SpanID() == send.SpanContext().SpanID())
	fmt.Println(process.Status().Code)
	// Output:
	// process payments
	// true
	// Error
}
