package inboxtype

import (
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Header names that inboxmq reads and writes on AMQP messages.
const (
	// HeaderAttempt carries the 1-based attempt number across broker-side
	// retries. A message without it is attempt 1.
	HeaderAttempt = "x-attempt"
	// HeaderError carries the reason a message was dead-lettered or retried:
	// "<reason>: <error text>", at most 1 KiB. A copy whose headers had to
	// be trimmed to fit the connection's frame ends it with "; original
	// headers trimmed: N dropped".
	HeaderError = "x-error"
	// HeaderFirstFailedAt and HeaderLastFailedAt carry RFC 3339 times. A
	// copy keeps an incoming first failure time only from one of its own
	// earlier copies (HeaderOriginalQueue names the same queue) and only if
	// it is a valid time not in the future; otherwise it is the time of
	// this failure.
	HeaderFirstFailedAt = "x-first-failed-at"
	HeaderLastFailedAt  = "x-last-failed-at"
	// HeaderOriginalQueue names the work queue a retried or dead-lettered
	// message came from.
	HeaderOriginalQueue = "x-original-queue"
	// HeaderIdempotencyKey carries the idempotency key on dead letters and
	// outbox messages, so operators can select by key.
	HeaderIdempotencyKey = "x-idempotency-key"
	// HeaderReplayCount counts how often a message was replayed from the DLQ.
	HeaderReplayCount = "x-replay-count"
	// HeaderDeliveryCount is set by quorum queues: how often the broker has
	// delivered (and got back) the message.
	HeaderDeliveryCount = "x-delivery-count"
	// HeaderFailedTraceparent and HeaderFailedTracestate carry, on a retry
	// or dead-letter copy, the W3C trace context of the attempt that
	// failed (middleware.Tracing writes them through
	// [Delivery.CopyHeaders]), so that the span of the next attempt links
	// to it. The copy's own traceparent stays the producer's.
	HeaderFailedTraceparent = "x-failed-traceparent"
	HeaderFailedTracestate  = "x-failed-tracestate"
)

// HeaderInt reads an integer header of any AMQP integer type (or a decimal
// string); a missing or malformed header reads as 0.
func HeaderInt(h amqp.Table, name string) int {
	switch v := h[name].(type) {
	case int:
		return v
	case int8:
		return int(v)
	case int16:
		return int(v)
	case int32:
		return int(v)
	case int64:
		return int(v)
	case uint8:
		return int(v)
	case uint16:
		return int(v)
	case uint32:
		return int(v)
	case string:
		n, err := strconv.Atoi(v)
		if err != nil {
			return 0
		}
		return n
	default:
		return 0
	}
}
