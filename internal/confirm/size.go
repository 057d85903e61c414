package confirm

import (
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A message's properties, its headers among them, travel in one content
// header frame, which must not exceed the connection's negotiated frame
// size (the body may span frames); the broker closes the connection on a
// larger one.

const (
	// frameOverhead is a frame's type, channel and size (7 bytes) and its
	// frame-end octet.
	frameOverhead = 8
	// contentHeaderFixed is a content header's class id, weight, body size
	// and property flags.
	contentHeaderFixed = 14
)

// ContentHeaderSize is the size of msg's content header frame: an upper
// bound, as every property is counted as present.
func ContentHeaderSize(msg *amqp.Publishing) int {
	n := frameOverhead + contentHeaderFixed
	for _, s := range [...]string{
		msg.ContentType, msg.ContentEncoding, msg.CorrelationId, msg.ReplyTo, msg.Expiration,
		msg.MessageId, msg.Type, msg.UserId, msg.AppId,
	} {
		n += 1 + len(s) // short string
	}
	n += 1 + 1 + 8 // delivery mode, priority, timestamp
	return n + TableSize(msg.Headers)
}

// TableSize is the encoded size of an AMQP field table.
func TableSize(t amqp.Table) int {
	n := 4 // its length
	for k, v := range t {
		n += EntrySize(k, v)
	}
	return n
}

// EntrySize is the encoded size of one table entry: its name (a short
// string) and its value.
func EntrySize(k string, v any) int { return 1 + len(k) + FieldSize(v) }

// FieldSize is the encoded size of a field value: a type octet and the
// value. A type amqp091 cannot encode counts as its type octet alone (the
// publish fails on it anyway).
func FieldSize(v any) int {
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
			n += FieldSize(e)
		}
		return n
	case amqp.Table:
		return 1 + TableSize(v)
	default: // nil and unsupported types
		return 1
	}
}
