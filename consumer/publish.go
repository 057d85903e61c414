package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/inboxmq/inboxmq/retry"
)

// errNotConfirmed is returned when the broker nacks a publish.
var errNotConfirmed = errors.New("consumer: broker did not confirm the publish (nack)")

// publisher is a connection's confirm-mode channel, shared by the workers
// for retry and dead-letter copies.
type publisher struct {
	ch      *amqp.Channel
	timeout time.Duration
}

func newPublisher(s *session, timeout time.Duration) (*publisher, error) {
	ch, err := s.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("consumer: open publisher channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("consumer: put publisher channel in confirm mode: %w", err)
	}
	s.watch("publisher channel", ch.NotifyClose(make(chan *amqp.Error, 1)))
	// Copies are published with mandatory set: a copy that no queue takes
	// (its queue was deleted behind our back) is returned and logged loudly.
	returns := ch.NotifyReturn(make(chan amqp.Return, 16))
	log := s.c.log
	go func() {
		for r := range returns {
			log.Error("consumer: a retry or dead-letter copy was returned unroutable; its queue is missing",
				zap.String("queue", r.RoutingKey), zap.String("message_id", r.MessageId),
				zap.Uint16("reply_code", r.ReplyCode), zap.String("reply_text", r.ReplyText))
		}
	}()
	return &publisher{ch: ch, timeout: timeout}, nil
}

// publish sends msg to queue through the default exchange and waits for the
// broker's confirm, bounded by the publish timeout.
func (p *publisher) publish(ctx context.Context, queue string, msg amqp.Publishing) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, msg)
	if err != nil {
		return fmt.Errorf("consumer: publish to %q: %w", queue, err)
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("consumer: wait for confirm from %q: %w", queue, err)
	}
	if !ok {
		return fmt.Errorf("consumer: publish to %q: %w", queue, errNotConfirmed)
	}
	return nil
}

// copyOf builds a persistent copy of raw (same body, ids and content type)
// with the given headers.
func copyOf(raw *amqp.Delivery, headers amqp.Table) amqp.Publishing {
	return amqp.Publishing{
		Headers:         headers,
		ContentType:     raw.ContentType,
		ContentEncoding: raw.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        raw.Priority,
		CorrelationId:   raw.CorrelationId,
		ReplyTo:         raw.ReplyTo,
		MessageId:       raw.MessageId,
		Timestamp:       raw.Timestamp,
		Type:            raw.Type,
		AppId:           raw.AppId,
		Body:            raw.Body,
	}
}

// maxErrorHeader bounds the x-error header.
const maxErrorHeader = 1024

// failureHeaders copies h (trace context included) and adds the failure
// headers: x-error, first and last failure times and x-original-queue. The
// broker's own x-delivery-count is dropped (it counts per queue).
func failureHeaders(h amqp.Table, queue, reason string, err error, now time.Time) amqp.Table {
	out := make(amqp.Table, len(h)+6)
	for k, v := range h {
		if k == HeaderDeliveryCount {
			continue
		}
		out[k] = v
	}
	msg := "unknown error"
	if err != nil {
		msg = errorText(err)
	}
	if reason == "" {
		reason = "error"
	}
	text := reason + ": " + msg
	if len(text) > maxErrorHeader {
		text = text[:maxErrorHeader]
	}
	ts := now.UTC().Format(time.RFC3339Nano)
	out[HeaderError] = text
	if _, ok := out[HeaderFirstFailedAt]; !ok {
		out[HeaderFirstFailedAt] = ts
	}
	out[HeaderLastFailedAt] = ts
	out[HeaderOriginalQueue] = queue
	return out
}

// errorText is err's text without the taxonomy's own wrappers (the reason
// already says "permanent" or "retry"), for the x-error header.
func errorText(err error) string {
	for {
		switch e := err.(type) {
		case *retry.PermanentError:
			err = e.Err
			continue
		case *retry.RetryableError:
			err = e.Err
			continue
		case interface {
			RetryReason() string
			Unwrap() error
		}:
			if inner := e.Unwrap(); inner != nil {
				err = inner
				continue
			}
		}
		return err.Error()
	}
}
