package middleware_test

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/middleware"
	"github.com/inboxmq/inboxmq/retry"
)

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
