package middleware

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/metrics"
)

// Metrics returns middleware that times the rest of the chain (lock, inbox,
// decoding and the business handler) and records it in m's
// handler_duration_seconds{queue,consumer,kind} histogram. The observation
// is made when the consumer has settled the delivery
// ([inboxtype.Delivery.OnSettled]), and kind is the kind of the decision it
// settled on (the route's Rules applied): a run retried in process counts
// as retry. When the ctx carries a sampled span (put [Tracing] outside
// Metrics), the observation carries its trace id as an exemplar, so a slow
// bucket in Grafana links to a trace. A delivery handled outside a
// consumer is observed when it is settled by hand
// ([inboxtype.Delivery.Settle]).
//
// The per-delivery counters (received, duplicates, retries, dead letters,
// end-to-end time) come from m as a consumer observer, not from this
// middleware: use both. A nil m returns middleware that does nothing.
func Metrics(m *metrics.Metrics) inboxtype.Middleware {
	return func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
		if m == nil {
			return next
		}
		return func(ctx context.Context, d *inboxtype.Delivery) error {
			var traceID string
			if sc := trace.SpanContextFromContext(ctx); sc.IsSampled() {
				traceID = sc.TraceID().String()
			}
			start := time.Now()
			var took time.Duration
			d.OnSettled(func(o inboxtype.Outcome) {
				m.ObserveHandler(d.Queue, d.Namespace, o.Decision.Kind, took, traceID)
			})
			defer func() { took = time.Since(start) }() // a panic too
			return next(ctx, d)
		}
	}
}
