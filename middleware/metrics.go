package middleware

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/metrics"
	"github.com/inboxmq/inboxmq/retry"
)

// Metrics returns middleware that times the rest of the chain (lock, inbox,
// decoding and the business handler) and records it in m's
// handler_duration_seconds{queue,consumer,kind} histogram, where kind is the
// default classification of the returned error for that run of the chain
// (the route's Rules and the retry policy apply later, when the consumer
// settles: the per-delivery counters carry that settled reason). When the ctx carries a sampled span
// (put [Tracing] outside Metrics), the observation carries its trace id as
// an exemplar, so a slow bucket in Grafana links to a trace.
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
			start := time.Now()
			err := next(ctx, d)
			var traceID string
			if sc := trace.SpanContextFromContext(ctx); sc.IsSampled() {
				traceID = sc.TraceID().String()
			}
			m.ObserveHandler(d.Queue, d.Namespace, retry.Classify(err).Kind, time.Since(start), traceID)
			return err
		}
	}
}
