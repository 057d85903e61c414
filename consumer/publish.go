package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/inboxmq/inboxmq/retry"
)

// errNotConfirmed is returned when the broker nacks a publish.
var errNotConfirmed = errors.New("consumer: broker did not confirm the publish (nack)")

// errReturned is returned when the broker confirms a copy that no queue
// took (its queue is missing): the copy is lost, so the original must not be
// acked.
var errReturned = errors.New("consumer: copy returned unroutable (its queue is missing)")

// headerCopyID tags each retry or dead-letter copy so that a basic.return
// can be matched to its publish. It has no meaning downstream.
const headerCopyID = "x-inboxmq-copy-id"

// publisher is a connection's confirm-mode channel, shared by the workers
// for retry and dead-letter copies.
type publisher struct {
	ch      *amqp.Channel
	timeout time.Duration
	log     *zap.Logger

	// returns receives the broker's basic.return frames. The broker sends a
	// copy's return before its confirm, and amqp091 hands both over in that
	// order, so once a copy is confirmed its return (if any) is already in
	// this channel: the waiter drains it into returned and looks itself up.
	returns  chan amqp.Return
	mu       sync.Mutex
	returned map[string]returnedCopy
	seq      atomic.Uint64
}

// returnedCopy is a return waiting for its publisher to look it up.
type returnedCopy struct {
	r  amqp.Return
	at time.Time
}

// returnsBuffer must exceed the publishes that can be outstanding at once
// (the workers of every route), or the connection's reader would block.
const returnsBuffer = 4096

func newPublisher(s *session, timeout time.Duration) (*publisher, error) {
	ch, err := s.pubConn.Channel()
	if err != nil {
		return nil, fmt.Errorf("consumer: open publisher channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("consumer: put publisher channel in confirm mode: %w", err)
	}
	s.watch("publisher channel", ch.NotifyClose(make(chan *amqp.Error, 1)))
	return newConfirmPublisher(ch, timeout, s.c.log), nil
}

// newConfirmPublisher wraps ch, already in confirm mode. Copies are
// published with mandatory set: a copy that no queue takes (its queue was
// deleted behind our back) is returned, and the publish fails (the original
// is requeued, never acked).
func newConfirmPublisher(ch *amqp.Channel, timeout time.Duration, log *zap.Logger) *publisher {
	p := &publisher{ch: ch, timeout: timeout, log: log, returned: make(map[string]returnedCopy)}
	p.returns = ch.NotifyReturn(make(chan amqp.Return, returnsBuffer))
	return p
}

// publish sends msg to queue through the default exchange and waits for the
// broker's confirm, bounded by the publish timeout. A nacked or returned
// copy is an error.
func (p *publisher) publish(ctx context.Context, queue string, msg amqp.Publishing) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	id := strconv.FormatUint(p.seq.Add(1), 36)
	h := make(amqp.Table, len(msg.Headers)+1)
	for k, v := range msg.Headers {
		h[k] = v
	}
	h[headerCopyID] = id
	msg.Headers = h
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
	if r, returned := p.takeReturn(id); returned {
		p.log.Error("consumer: a retry or dead-letter copy was returned unroutable; its queue is missing",
			zap.String("queue", r.RoutingKey), zap.String("message_id", r.MessageId),
			zap.Uint16("reply_code", r.ReplyCode), zap.String("reply_text", r.ReplyText))
		return fmt.Errorf("consumer: publish to %q: %w", queue, errReturned)
	}
	return nil
}

// takeReturn drains the returns received so far and reports whether the
// copy tagged id was among them (removing it).
func (p *publisher) takeReturn(id string) (amqp.Return, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	for {
		select {
		case r := <-p.returns:
			if rid, ok := r.Headers[headerCopyID].(string); ok {
				p.returned[rid] = returnedCopy{r: r, at: now}
			}
			continue
		default:
		}
		break
	}
	rc, ok := p.returned[id]
	delete(p.returned, id)
	// Returns whose publisher gave up waiting (timed out or nacked) are
	// never looked up: forget them once no waiter can still be alive.
	if len(p.returned) > 0 {
		for k, v := range p.returned {
			if now.Sub(v.at) > 2*p.timeout+time.Minute {
				delete(p.returned, k)
			}
		}
	}
	return rc.r, ok
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
		if k == HeaderDeliveryCount || k == headerCopyID {
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
		if err == nil {
			return "unknown error"
		}
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
