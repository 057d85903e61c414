package logs_test

import (
	"log/slog"
	"os"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	logobs "github.com/inboxmq/inboxmq/internal/logs"
	"github.com/inboxmq/inboxmq/retry"
)

// ExampleNewObserver writes one JSON line per transition. The consumer
// calls the observer; here a duplicate's outcome is reported by hand. Any
// slog handler works: slog's own JSON handler here, zap's through zapslog
// in examples/payment-worker.
func ExampleNewObserver() {
	logger := slog.New(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{} // stable output for the example
			}
			return a
		},
	}))
	obs := logobs.NewObserver(logger, nil)

	d := inboxtype.NewDelivery("payments", "payments", "worker-1", &amqp.Delivery{MessageId: "m-1", Redelivered: true})
	d.Key = "payment:order-42"
	obs.OnOutcome(d, inboxtype.Outcome{Action: inboxtype.ActionAcked, Decision: retry.Classify(retry.Duplicate(retry.SourceInbox, nil))})
	// Output:
	// {"level":"INFO","msg":"delivery duplicate","status":"duplicate","message_id":"m-1","idempotency_key":"payment:order-42","namespace":"payments","queue":"payments","worker_id":"worker-1","attempt":1,"redelivered":true,"duration":0,"duplicate_source":"inbox","duplicate_origin":"redelivery"}
}
