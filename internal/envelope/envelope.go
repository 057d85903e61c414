// Package envelope builds what every message inboxmq publishes for a
// producer carries around its body: the message id derived from the
// idempotency key and destination, and the headers (the key, the W3C
// trace context). The outbox and package producer both use it, so a
// message sent by either is identified, and deduplicated by the
// receiver's inbox, the same way.
package envelope

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/propagation"

	"github.com/inboxmq/inboxmq/inboxtype"
)

// DeriveID returns the message id derived from an idempotency key and the
// destination: a UUID-formatted (version 8) SHA-256 of the three, so the
// same key sent to two destinations gets two ids, and the same key sent
// again to the same destination gets the same id.
func DeriveID(exchange, routingKey, key string) string {
	// The hash input is "<len>:<s>;" for each of the three, built without
	// fmt: this runs once per message sent.
	var stack [128]byte
	in := stack[:0]
	for _, s := range [...]string{exchange, routingKey, key} {
		in = strconv.AppendInt(in, int64(len(s)), 10)
		in = append(in, ':')
		in = append(in, s...)
		in = append(in, ';')
	}
	sum := sha256.Sum256(in)
	u := sum[:16]
	u[6] = (u[6] & 0x0f) | 0x80 // version 8: custom (RFC 9562)
	u[8] = (u[8] & 0x3f) | 0x80 // RFC 9562 variant
	var out [36]byte
	hex.Encode(out[0:8], u[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], u[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], u[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], u[8:10])
	out[23] = '-'
	hex.Encode(out[24:36], u[10:16])
	return string(out[:])
}

// Headers returns a copy of h (never nil) with the idempotency key in
// [inboxtype.HeaderIdempotencyKey] when key is not empty, and the W3C trace
// context of ctx (traceparent, tracestate) when ctx carries a span and h
// has no traceparent yet.
func Headers(ctx context.Context, h amqp.Table, key string) amqp.Table {
	out := maps.Clone(h)
	if out == nil {
		out = amqp.Table{}
	}
	if key != "" {
		out[inboxtype.HeaderIdempotencyKey] = key
	}
	if _, ok := out["traceparent"]; !ok {
		propagation.TraceContext{}.Inject(ctx, Carrier(out))
	}
	return out
}

// Carrier lets otel's propagators read and write AMQP headers.
type Carrier amqp.Table

var _ propagation.TextMapCarrier = Carrier(nil)

func (c Carrier) Get(key string) string {
	s, _ := c[key].(string)
	return s
}

func (c Carrier) Set(key, value string) { c[key] = value }

func (c Carrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
