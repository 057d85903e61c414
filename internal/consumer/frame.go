package consumer

import (
	"cmp"
	"slices"
	"strconv"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/confirm"
)

// A message's properties, its headers among them, travel in one content
// header frame, which must not exceed the connection's negotiated frame
// size (the body may span frames). The broker closes the connection on a
// larger one. A retry or dead-letter copy adds its failure headers to the
// original's, so a message the broker accepted may have a copy that does
// not fit: fitFrame trims the copy's headers until it does.

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
	case inboxtype.HeaderAttempt, inboxtype.HeaderError, inboxtype.HeaderFirstFailedAt, inboxtype.HeaderLastFailedAt, inboxtype.HeaderOriginalQueue,
		headerOrderingKey:
		return 3
	case inboxtype.HeaderIdempotencyKey:
		return 2
	case inboxtype.HeaderReplayCount, headerReplayRefused, "traceparent", "tracestate", "baggage",
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
	if frameMax <= 0 || confirm.ContentHeaderSize(msg) <= frameMax {
		return 0
	}
	h := cloneTable(msg.Headers)
	size := confirm.ContentHeaderSize(msg)
	errText, _ := h[inboxtype.HeaderError].(string)
	if v, ok := h[inboxtype.HeaderError]; ok {
		size -= confirm.EntrySize(inboxtype.HeaderError, v)
		delete(h, inboxtype.HeaderError)
	}
	dropped := 0
	fits := func() bool { return size+confirm.EntrySize(inboxtype.HeaderError, noted(errText, dropped)) <= frameMax }
	for rank := range 3 {
		keys := make([]string, 0, len(h))
		for k := range h {
			if trimRank(k) == rank {
				keys = append(keys, k)
			}
		}
		slices.SortFunc(keys, func(a, b string) int {
			return cmp.Or(cmp.Compare(confirm.EntrySize(b, h[b]), confirm.EntrySize(a, h[a])), cmp.Compare(a, b))
		})
		for _, k := range keys {
			if fits() {
				break
			}
			size -= confirm.EntrySize(k, h[k])
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
