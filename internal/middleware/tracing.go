package middleware

import (
	"context"
	"strings"
	"sync/atomic"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// TracerName is the instrumentation scope name of inboxmq's spans.
const TracerName = "github.com/inboxmq/inboxmq"

// Span attribute keys. The messaging.* keys follow the OpenTelemetry
// messaging semantic conventions; inboxmq.* are this project's own.
// docs/observability.md lists them; that list is the contract.
const (
	attrMessagingSystem      = attribute.Key("messaging.system")
	attrMessagingOperation   = attribute.Key("messaging.operation")
	attrMessagingOpType      = attribute.Key("messaging.operation.type")
	attrMessagingOpName      = attribute.Key("messaging.operation.name")
	attrMessagingDestination = attribute.Key("messaging.destination.name")
	attrMessagingMessageID   = attribute.Key("messaging.message.id")
	attrMessagingBodySize    = attribute.Key("messaging.message.body.size")
	attrMessagingGroup       = attribute.Key("messaging.consumer.group.name")
	attrRabbitRoutingKey     = attribute.Key("messaging.rabbitmq.destination.routing_key")
	attrRabbitDeliveryTag    = attribute.Key("messaging.rabbitmq.message.delivery_tag")
	attrIdempotencyKey       = attribute.Key("inboxmq.idempotency_key")
	attrAttempt              = attribute.Key("inboxmq.attempt")
	attrRedelivered          = attribute.Key("inboxmq.redelivered")
	attrOutcome              = attribute.Key("inboxmq.outcome")
	attrAction               = attribute.Key("inboxmq.action")
	attrDelay                = attribute.Key("inboxmq.delay_seconds")
	attrInProcessRetries     = attribute.Key("inboxmq.in_process_retries")
	attrReason               = attribute.Key("inboxmq.reason")
	attrDuplicateSource      = attribute.Key("inboxmq.duplicate_source")
	attrLockKey              = attribute.Key("inboxmq.lock_key")
	attrLockResult           = attribute.Key("inboxmq.lock_result")
	attrLockFence            = attribute.Key("inboxmq.lock_fence")
	attrFence                = attribute.Key("inboxmq.fence")
	attrLink                 = attribute.Key("inboxmq.link")
)

// TracingOpts configures [Tracing]. A nil *TracingOpts means all defaults.
type TracingOpts struct {
	// Propagator extracts the parent trace context from the delivery's
	// headers. Defaults to propagation.TraceContext{} (the W3C traceparent
	// and tracestate headers); pass a composite propagator to add baggage.
	Propagator propagation.TextMapPropagator
	// IdempotencyKeyAttribute controls whether the idempotency key is put on
	// the span (inboxmq.idempotency_key). Keys usually name business
	// entities (an order id); set it to false if those must not reach your
	// tracing backend. Defaults to true (a nil pointer).
	IdempotencyKeyAttribute *bool
}

func (o *TracingOpts) propagator() propagation.TextMapPropagator {
	if o == nil || o.Propagator == nil {
		return propagation.TraceContext{}
	}
	return o.Propagator
}

func (o *TracingOpts) keyAttribute() bool {
	return o == nil || o.IdempotencyKeyAttribute == nil || *o.IdempotencyKeyAttribute
}

// Tracing returns router-wide middleware that starts one consumer span per
// delivery, named "process <queue>", as a child of the trace context the
// publisher wrote into the AMQP headers (see [InjectHeaders]); a delivery
// without one starts a new trace. The span carries the messaging semantic
// convention attributes (messaging.system=rabbitmq,
// messaging.destination.name, messaging.message.id,
// messaging.operation=process) and inboxmq's own (idempotency key, attempt,
// redelivered, lock key, lock result, the Redis lock's fence, the inbox
// claim's fence, and the outcome below).
//
// The handler's ctx carries the span, so database and HTTP instrumentation
// below it nests under the delivery. The span ends when the consumer has
// settled the delivery ([inboxtype.Delivery.OnSettled]), so it covers the
// settlement, and it reports the settled [inboxtype.Outcome], the decision
// the consumer acted on with the route's Rules and retry policy applied:
// inboxmq.outcome (the decision's kind), inboxmq.action (acked, retried,
// dead_lettered, requeued, abandoned), inboxmq.reason (a Rule's reason,
// exhausted after the last attempt), inboxmq.duplicate_source,
// inboxmq.delay_seconds (the delay tier of a retry) and
// inboxmq.in_process_retries. A decision other than success or duplicate
// (a duplicate is a success: the effect exists), or a settlement that
// failed, records the error and sets the status to Error.
//
// A span covers one run of the chain: each in-process try has its own,
// which ends when the next try starts, with action retried_in_process.
// A delivery handled outside a consumer (a test, a tool) ends its span
// when it is settled by hand ([inboxtype.Delivery.Settle]). Put Tracing near
// the outside of the chain so that the span covers the lock and the inbox.
//
// # Retries and dead letters
//
// The consumer copies the headers, and so the publisher's trace context,
// onto a retry or dead-letter copy: the next attempt stays in the
// publisher's trace, a child of the same parent. Tracing also writes the
// failed run's own context into the copy ([inboxtype.Delivery.CopyHeaders],
// headers [inboxtype.HeaderFailedTraceparent] and
// [inboxtype.HeaderFailedTracestate]), and the span of the next attempt
// links to it (link attribute inboxmq.link=failed_attempt): the attempts of
// one job read as a chain, not as unrelated siblings.
//
// # Cost
//
// A nil tp means otel.GetTracerProvider(), read when Tracing is called,
// which is a no-op until the program installs an SDK: inboxmq forces no
// exporter. A span that does not record (no SDK, or not sampled) gets no
// attributes, no link and no settlement hook; the delivery's trace context
// still reaches the handler's ctx. A tp from go.opentelemetry.io/otel/trace/noop
// makes Tracing return the chain unchanged.
func Tracing(tp trace.TracerProvider, opts *TracingOpts) inboxtype.Middleware {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if _, ok := tp.(noop.TracerProvider); ok {
		return func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler { return next }
	}
	tracer := tp.Tracer(TracerName)
	prop := opts.propagator()
	withKey := opts.keyAttribute()
	startOpts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	return func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
		var name spanName // one chain serves one route: one queue
		return func(ctx context.Context, d *inboxtype.Delivery) error {
			ctx = prop.Extract(ctx, HeaderCarrier(d.Headers))
			ctx, span := tracer.Start(ctx, name.get(d.Queue), startOpts...)
			if !span.IsRecording() {
				return next(ctx, d)
			}
			span.SetAttributes(startAttrs(d)...)
			if sc := span.SpanContext(); sc.IsSampled() {
				d.TraceID = sc.TraceID().String() // the latency exemplars' trace_id
			}
			if sc := trace.SpanContextFromContext(prop.Extract(context.Background(), failedCarrier(d.Headers))); sc.IsValid() {
				span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{
					attrLink.String("failed_attempt"),
				}})
			}
			// The copy of a failed run links back to this span.
			copyHeaders := amqp.Table{}
			prop.Inject(ctx, failedCarrier(copyHeaders))
			d.CopyHeaders = copyHeaders
			// Registered before next runs, so the span ends even if the
			// chain below panics (the consumer's last guard settles it).
			d.OnSettled(func(o inboxtype.Outcome) { endSpan(span, d, o, withKey) })
			return next(ctx, d)
		}
	}
}

// startAttrs are the span's attributes known when the delivery arrives.
func startAttrs(d *inboxtype.Delivery) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		attrMessagingSystem.String("rabbitmq"),
		attrMessagingOperation.String("process"),
		attrMessagingOpType.String("process"),
		attrMessagingOpName.String("process"),
		attrMessagingDestination.String(d.Queue),
		attrMessagingGroup.String(d.Namespace),
		attrMessagingBodySize.Int(len(d.Body)),
		attrAttempt.Int(d.Attempt),
		attrRedelivered.Bool(d.Redelivered),
	}
	if d.MessageID != "" {
		attrs = append(attrs, attrMessagingMessageID.String(d.MessageID))
	}
	if d.Raw != nil {
		if d.Raw.RoutingKey != "" {
			attrs = append(attrs, attrRabbitRoutingKey.String(d.Raw.RoutingKey))
		}
		attrs = append(attrs, attrRabbitDeliveryTag.Int64(int64(d.Raw.DeliveryTag))) //nolint:gosec // tags fit
	}
	return attrs
}

// spanName caches "process <queue>" so that a span that does not record
// costs no allocation for its name.
type spanName struct {
	last atomic.Pointer[[2]string] // queue, name
}

func (n *spanName) get(queue string) string {
	if p := n.last.Load(); p != nil && p[0] == queue {
		return p[1]
	}
	name := "process " + queue
	n.last.Store(&[2]string{queue, name})
	return name
}

// failedCarrier reads and writes the failed attempt's trace context in the
// headers of a retry or dead-letter copy: traceparent as
// HeaderFailedTraceparent, tracestate as HeaderFailedTracestate, any other
// field of the propagator under the same "x-failed-" prefix.
type failedCarrier amqp.Table

func (c failedCarrier) field(key string) string {
	switch key {
	case "traceparent":
		return inboxtype.HeaderFailedTraceparent
	case "tracestate":
		return inboxtype.HeaderFailedTracestate
	default:
		return failedPrefix + key
	}
}

const failedPrefix = "x-failed-"

func (c failedCarrier) Get(key string) string { return HeaderCarrier(c).Get(c.field(key)) }

func (c failedCarrier) Set(key, value string) { c[c.field(key)] = value }

func (c failedCarrier) Keys() []string {
	var keys []string
	for k := range c {
		if rest, ok := strings.CutPrefix(k, failedPrefix); ok {
			keys = append(keys, rest)
		}
	}
	return keys
}

// endSpan sets the annotations the chain made on d and the settled
// outcome o on span, and ends it.
func endSpan(span trace.Span, d *inboxtype.Delivery, o inboxtype.Outcome, withKey bool) {
	defer span.End()
	if withKey && d.Key != "" {
		span.SetAttributes(attrIdempotencyKey.String(d.Key))
	}
	if d.LockKey != "" {
		span.SetAttributes(attrLockKey.String(d.LockKey))
	}
	if d.LockResult != "" {
		span.SetAttributes(attrLockResult.String(d.LockResult))
	}
	if d.LockFence != 0 {
		span.SetAttributes(attrLockFence.Int64(d.LockFence))
	}
	if d.InboxFence != 0 {
		span.SetAttributes(attrFence.Int64(d.InboxFence))
	}
	dec := o.Decision
	span.SetAttributes(attrOutcome.String(dec.Kind.String()), attrInProcessRetries.Int(o.InProcessRetries))
	if o.Action != "" {
		span.SetAttributes(attrAction.String(string(o.Action)))
	}
	if o.Delay > 0 {
		span.SetAttributes(attrDelay.Float64(o.Delay.Seconds()))
	}
	switch dec.Kind {
	case retry.KindSucceeded:
	case retry.KindDuplicate:
		span.SetAttributes(attrDuplicateSource.String(dec.Source))
	default:
		span.SetAttributes(attrReason.String(dec.Reason))
		if dec.Err != nil {
			span.RecordError(dec.Err)
			span.SetStatus(codes.Error, dec.Err.Error())
		} else {
			span.SetStatus(codes.Error, dec.Reason)
		}
	}
	if o.Err != nil { // the settlement itself failed
		span.RecordError(o.Err)
		span.SetStatus(codes.Error, o.Err.Error())
	}
}

// InjectHeaders writes the trace context of ctx (W3C traceparent and
// tracestate) into the AMQP headers h and returns them; a nil h gets a new
// table. Publishers call it (the outbox relay, a producer) so that the
// consumer's span joins the publisher's trace. With no span in ctx it
// writes nothing.
func InjectHeaders(ctx context.Context, h amqp.Table) amqp.Table {
	if h == nil {
		h = amqp.Table{}
	}
	propagation.TraceContext{}.Inject(ctx, HeaderCarrier(h))
	return h
}

// HeaderCarrier adapts AMQP headers to propagation.TextMapCarrier, so any
// OpenTelemetry propagator can read and write them. Values written are
// strings; values read may be strings or byte slices (as other clients
// send them). A nil HeaderCarrier reads as empty and panics on Set.
type HeaderCarrier amqp.Table

var _ propagation.TextMapCarrier = HeaderCarrier(nil)

// Get returns the header as a string, or "" if it is absent or not text.
func (c HeaderCarrier) Get(key string) string {
	switch v := c[key].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	default:
		return ""
	}
}

// Set writes the header as a string.
func (c HeaderCarrier) Set(key, value string) { c[key] = value }

// Keys lists the header names.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
