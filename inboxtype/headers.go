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
	// HeaderPublishedAt is when the message was first published, in Unix
	// microseconds: package producer sets it, and the copies inboxmq makes
	// (retries, dead letters, replays) keep it. The critical-time histogram
	// measures from it, else from the AMQP timestamp, which has a
	// resolution of one second.
	HeaderPublishedAt = "x-published-at"

	// HeaderReplayedOutcome is true on a reply that a duplicate got: the
	// stored outcome of the job's first run, replayed (the job did not run
	// again). A first answer does not carry it.
	HeaderReplayedOutcome = "x-replayed-outcome"
	// HeaderDeliveryCount is set by quorum queues: how often the broker has
	// delivered (and got back) the message.
	HeaderDeliveryCount = "x-delivery-count"
	// HeaderFailedTraceparent and HeaderFailedTracestate carry, on a retry
	// or dead-letter copy, the W3C trace context of the attempt that
	// failed (the worker's tracing writes them through
	// [Delivery.CopyHeaders]), so that the span of the next attempt links
	// to it. The copy's own traceparent stays the producer's.
	HeaderFailedTraceparent = "x-failed-traceparent"
	HeaderFailedTracestate  = "x-failed-tracestate"
	// HeaderParkedReason, HeaderParkedPattern and HeaderParkedAt are set
	// on a message parked in [ParkedQueue] because its key is blocked: the
	// block's reason ("blocked" when it has none), the blocked key or key
	// prefix that matched, and when it was parked (RFC 3339). The message
	// keeps its other headers and properties, and gains
	// HeaderIdempotencyKey and HeaderOriginalQueue. A release back to the
	// work queue removes the three.
	HeaderParkedReason  = "x-parked-reason"
	HeaderParkedPattern = "x-parked-pattern"
	HeaderParkedAt      = "x-parked-at"
)

// DeadLetterReason returns why a dead letter is in its dead-letter queue.
// When inboxmq dead-lettered it, that is its [HeaderError] header
// ("<reason>: <error text>", such as "decode: invalid character"). When
// the broker did, because the message expired, was rejected, exceeded a
// length limit or the delivery limit in its work queue, that is the
// broker's x-death reason followed by " (broker)", such as
// "expired (broker)"; this holds even for a message that carries an older
// HeaderError from a retry. It returns "" when the headers say neither.
func DeadLetterReason(h amqp.Table) string {
	if reason, _, ok := brokerDeath(h); ok {
		return reason + " (broker)"
	}
	s, _ := h[HeaderError].(string)
	return s
}

// DeadLetterOrigin returns the work queue a dead letter came from: its
// [HeaderOriginalQueue] header when inboxmq dead-lettered or retried it,
// else the queue the broker dead-lettered it from (x-death). It returns
// "" when the headers say neither.
func DeadLetterOrigin(h amqp.Table) string {
	if q, ok := h[HeaderOriginalQueue].(string); ok && q != "" {
		return q
	}
	_, q, _ := brokerDeath(h)
	return q
}

// brokerDeath reports the reason and queue of the broker's dead-lettering
// that brought the message to its DLQ. The broker lists its most recent
// dead-lettering first in x-death. A message that inboxmq retried carries
// x-death entries of its delay tiers too (they expire back into the work
// queue): the last one counts only when it names the work queue itself
// (x-original-queue). Without a usable x-death, the x-first-death headers
// count for a message that inboxmq never handled.
func brokerDeath(h amqp.Table) (reason, queue string, ok bool) {
	orig, handled := h[HeaderOriginalQueue].(string)
	if deaths, _ := h["x-death"].([]any); len(deaths) > 0 {
		if d, isTable := deaths[0].(amqp.Table); isTable {
			reason, _ = d["reason"].(string)
			queue, _ = d["queue"].(string)
			if reason != "" && queue != "" && (!handled || orig == queue) {
				return reason, queue, true
			}
			return "", "", false
		}
	}
	if handled {
		return "", "", false
	}
	reason, _ = h["x-first-death-reason"].(string)
	queue, _ = h["x-first-death-queue"].(string)
	if reason == "" || queue == "" {
		return "", "", false
	}
	return reason, queue, true
}

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
