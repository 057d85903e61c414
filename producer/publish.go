package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/envelope"
)

// Encoder turns a body into bytes. [JSON] is the default, and the format an
// inboxmq worker's routes decode.
type Encoder interface {
	// Encode serialises v.
	Encode(v any) ([]byte, error)
	// ContentType is the AMQP content type Encode produces.
	ContentType() string
}

// JSON is the default [Encoder]: encoding/json, content type
// application/json, which the consumer's default codec decodes.
var JSON Encoder = jsonEncoder{}

type jsonEncoder struct{}

func (jsonEncoder) Encode(v any) ([]byte, error) { return json.Marshal(v) }
func (jsonEncoder) ContentType() string          { return "application/json" }

// PublishOpts are the per-call settings of [Publish]. A nil *PublishOpts
// means all defaults.
type PublishOpts struct {
	// Key is the idempotency key. Defaults to the body's IdempotencyKey
	// ([inboxtype.Keyer], on the value or its pointer); a body without
	// one needs Key. Keys that [inboxtype.ValidKey] refuses are refused.
	Key string
	// MessageID is the AMQP message id. Defaults to the id derived from
	// the exchange, the routing key and the key, as the outbox derives it:
	// the same for every publish of the same key to the same destination.
	// The receiving inbox deduplicates by key, never by message id.
	MessageID string
	// Headers are extra AMQP headers. Defaults to none. The key header and,
	// when ctx carries a span, the W3C trace context are added.
	Headers amqp.Table
	// Encoder encodes the body. Defaults to [JSON].
	Encoder Encoder
	// AllowUnroutable publishes without the mandatory flag: a message no
	// queue would get is dropped by the broker and Publish returns nil.
	// Defaults to false: such a message is an [*UnroutableError].
	AllowUnroutable bool
}

func (o *PublishOpts) encoder() Encoder {
	if o == nil || o.Encoder == nil {
		return JSON
	}
	return o.Encoder
}

// Publish encodes body and publishes it to exchange with routingKey (on
// the default exchange "", routingKey names the queue), persistent, and
// waits for the broker's confirm: nil means the message is on a queue.
// The body's own Validate ([inboxtype.Validator]) runs first; an invalid
// body, key or encoding is an [*InvalidError] and nothing is sent.
//
// The idempotency key travels in the header x-idempotency-key and the
// message id is derived from it (see [PublishOpts]). Failures are retried
// as the package documentation says, bounded by ctx (its error is in the
// returned chain when it ended the wait) and Config.RetryTimeout.
func Publish[T any](ctx context.Context, p *Producer, exchange, routingKey string, body T, opts *PublishOpts) error {
	var o PublishOpts
	if opts != nil {
		o = *opts
	}
	if v, ok := any(&body).(inboxtype.Validator); ok {
		if err := v.Validate(); err != nil {
			return &InvalidError{Err: err}
		}
	}
	if o.Key == "" {
		k, ok := any(&body).(inboxtype.Keyer)
		if !ok {
			return &InvalidError{Err: fmt.Errorf("%T has no IdempotencyKey method and PublishOpts.Key is empty", body)}
		}
		o.Key = k.IdempotencyKey()
	}
	enc := opts.encoder()
	b, err := enc.Encode(body)
	if err != nil {
		return &InvalidError{Err: fmt.Errorf("encode %T: %w", body, err)}
	}
	return p.Send(ctx, &Message{
		Exchange: exchange, RoutingKey: routingKey, Key: o.Key, ID: o.MessageID,
		ContentType: enc.ContentType(), Headers: o.Headers, Body: b, AllowUnroutable: o.AllowUnroutable,
	})
}

// Message is an encoded message for [Producer.Send]: for bodies already in
// bytes (a relayed payload, a test's malformed input). It needs an
// idempotency key or a message id.
type Message struct {
	// Exchange is the exchange to publish to. Empty means the default
	// exchange, where RoutingKey names the queue.
	Exchange string
	// RoutingKey is the routing key.
	RoutingKey string
	// Key is the idempotency key, sent in the header x-idempotency-key.
	// Empty means no such header; ID must then be set.
	Key string
	// ID is the AMQP message id. Empty means derived from Exchange,
	// RoutingKey and Key (as Publish does).
	ID string
	// ContentType is the AMQP content type. Empty means none.
	ContentType string
	// Headers are extra AMQP headers. Nil means none; the trace context is
	// added when ctx carries a span.
	Headers amqp.Table
	// Body is the payload.
	Body []byte
	// AllowUnroutable publishes without the mandatory flag (see
	// PublishOpts.AllowUnroutable). Defaults to false.
	AllowUnroutable bool
}

// Send publishes msg, persistent, and waits for the broker's confirm, with
// the retries and errors of [Publish]. It is Publish for a body already
// encoded; msg is not modified.
func (p *Producer) Send(ctx context.Context, msg *Message) error {
	if msg == nil {
		return &InvalidError{Err: errors.New("nil message")}
	}
	if msg.Key != "" {
		if err := inboxtype.ValidKey(msg.Key); err != nil {
			return &InvalidError{Err: err}
		}
	}
	id := msg.ID
	if id == "" {
		if msg.Key == "" {
			return ErrNoID
		}
		id = envelope.DeriveID(msg.Exchange, msg.RoutingKey, msg.Key)
	}
	if p.isClosed() {
		return ErrClosed
	}
	dest := msg.Exchange
	if dest == "" {
		dest = msg.RoutingKey
	}
	sctx, span := p.tracer.Start(ctx, "publish "+dest, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String("messaging.system", "rabbitmq"),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.operation.name", "publish"),
			attribute.String("messaging.destination.name", dest),
			attribute.String("messaging.rabbitmq.destination.routing_key", msg.RoutingKey),
			attribute.String("messaging.message.id", id),
			attribute.Int("messaging.message.body.size", len(msg.Body)),
		))
	defer span.End()
	headers := envelope.Headers(sctx, msg.Headers, msg.Key)
	now := time.Now()
	if _, ok := headers[inboxtype.HeaderPublishedAt]; !ok {
		headers[inboxtype.HeaderPublishedAt] = now.UnixMicro()
	}
	if err := headers.Validate(); err != nil {
		err = &InvalidError{Err: fmt.Errorf("headers: %w", err)}
		span.SetStatus(codes.Error, err.Error())
		return err
	}
	err := p.send(ctx, msg.Exchange, msg.RoutingKey, !msg.AllowUnroutable, &amqp.Publishing{
		Headers:      headers,
		ContentType:  msg.ContentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    id,
		Timestamp:    now,
		Body:         msg.Body,
	})
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}
