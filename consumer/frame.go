package consumer

import (
	"cmp"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
)

// A message's properties, its headers among them, travel in one content
// header frame, which must not exceed the connection's negotiated frame
// size (the body may span frames). The broker closes the connection on a
// larger one. A retry or dead-letter copy adds its failure headers to the
// original's, so a message the broker accepted may have a copy that does
// not fit: fitFrame trims the copy's headers until it does.

const (
	// frameOverhead is a frame's type, channel and size (7 bytes) and its
	// frame-end octet.
	frameOverhead = 8
	// contentHeaderFixed is a content header's class id, weight, body size
	// and property flags.
	contentHeaderFixed = 14
)

// trimNote is appended to x-error when fitFrame dropped headers.
func trimNote(dropped int) string {
	return "original headers trimmed: " + strconv.Itoa(dropped) + " dropped"
}

// trimRank orders the headers fitFrame drops: the original headers first
// (0), then inboxmq's other headers and the W3C trace context (1), then
// the idempotency key (2, the body still carries it); the attempt, the
// failure's reason and times and the original queue always stay (3). Those
// always fit in the smallest frame AMQP allows (4096 bytes): x-error is
// bounded and the other properties are short strings.
func trimRank(k string) int {
	switch k {
	case inboxtype.HeaderAttempt, inboxtype.HeaderError, inboxtype.HeaderFirstFailedAt, inboxtype.HeaderLastFailedAt, inboxtype.HeaderOriginalQueue:
		return 3
	case inboxtype.HeaderIdempotencyKey:
		return 2
	case inboxtype.HeaderReplayCount, HeaderReplayRefused, "traceparent", "tracestate", "baggage",
		inboxtype.HeaderFailedTraceparent, inboxtype.HeaderFailedTracestate:
		return 1
	default:
		return 0
	}
}

// fitFrame trims msg's headers until its content header fits in one frame
// of frameMax bytes (0 means no limit) and reports how many it dropped.
// The original headers go first, largest first; inboxmq's own headers, the
// trace context and then the idempotency key go only if the originals
// alone cannot make room; the failure headers always stay ([trimRank]). A
// trimmed copy's x-error ends with "original headers trimmed: N dropped".
func fitFrame(msg *amqp.Publishing, frameMax int) int {
	if frameMax <= 0 || contentHeaderSize(msg) <= frameMax {
		return 0
	}
	h := cloneTable(msg.Headers)
	size := contentHeaderSize(msg)
	errText, _ := h[inboxtype.HeaderError].(string)
	if v, ok := h[inboxtype.HeaderError]; ok {
		size -= entrySize(inboxtype.HeaderError, v)
		delete(h, inboxtype.HeaderError)
	}
	dropped := 0
	fits := func() bool { return size+entrySize(inboxtype.HeaderError, noted(errText, dropped)) <= frameMax }
	for rank := range 3 {
		keys := make([]string, 0, len(h))
		for k := range h {
			if trimRank(k) == rank {
				keys = append(keys, k)
			}
		}
		slices.SortFunc(keys, func(a, b string) int {
			return cmp.Or(cmp.Compare(entrySize(b, h[b]), entrySize(a, h[a])), cmp.Compare(a, b))
		})
		for _, k := range keys {
			if fits() {
				break
			}
			size -= entrySize(k, h[k])
			delete(h, k)
			dropped++
		}
	}
	h[inboxtype.HeaderError] = noted(errText, dropped)
	msg.Headers = h
	return dropped
}

// noted is x-error with the trim note, bounded like any x-error: the error
// text is shortened (at a rune boundary) to make room for the note.
func noted(errText string, dropped int) string {
	note := trimNote(dropped)
	if errText == "" {
		return note
	}
	note = "; " + note
	if n := maxErrorHeader - len(note); len(errText) > n {
		for n > 0 && !utf8.RuneStart(errText[n]) {
			n--
		}
		errText = errText[:n]
	}
	return errText + note
}

// contentHeaderSize is the size of msg's content header frame: an upper
// bound, as every property is counted as present.
func contentHeaderSize(msg *amqp.Publishing) int {
	n := frameOverhead + contentHeaderFixed
	for _, s := range [...]string{
		msg.ContentType, msg.ContentEncoding, msg.CorrelationId, msg.ReplyTo, msg.Expiration,
		msg.MessageId, msg.Type, msg.UserId, msg.AppId,
	} {
		n += 1 + len(s) // short string
	}
	n += 1 + 1 + 8 // delivery mode, priority, timestamp
	return n + tableSize(msg.Headers)
}

// tableSize is the encoded size of an AMQP field table.
func tableSize(t amqp.Table) int {
	n := 4 // its length
	for k, v := range t {
		n += entrySize(k, v)
	}
	return n
}

// entrySize is the encoded size of one table entry: its name (a short
// string) and its value.
func entrySize(k string, v any) int { return 1 + len(k) + fieldSize(v) }

// fieldSize is the encoded size of a field value: a type octet and the
// value. A type amqp091 cannot encode counts as its type octet alone (the
// publish fails on it anyway).
func fieldSize(v any) int {
	switch v := v.(type) {
	case bool, byte, int8:
		return 1 + 1
	case int16, uint16:
		return 1 + 2
	case int, int32, uint32, float32:
		return 1 + 4
	case int64, float64, time.Time:
		return 1 + 8
	case amqp.Decimal:
		return 1 + 5
	case string:
		return 1 + 4 + len(v)
	case []byte:
		return 1 + 4 + len(v)
	case []any:
		n := 1 + 4
		for _, e := range v {
			n += fieldSize(e)
		}
		return n
	case amqp.Table:
		return 1 + tableSize(v)
	default: // nil and unsupported types
		return 1
	}
}
