package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// errNotConfirmed is returned when the broker nacks a publish.
var errNotConfirmed = errors.New("consumer: broker did not confirm the publish (nack)")

// errReturned is returned when the broker confirms a copy that no queue
// took (its queue is missing): the copy is lost, so the original must not be
// acked.
var errReturned = errors.New("consumer: copy returned unroutable (its queue is missing)")

// publisher publishes the retry and dead-letter copies of one connection
// with publisher confirms, on a small pool of confirm-mode channels. Each
// channel carries one publish at a time: the broker sends a copy's
// basic.return before its confirm on the same channel, and amqp091 hands
// both over in that order, so a return waiting on the channel once the
// confirm arrived belongs to that publish. No header on the copy is needed
// to match a return to its publish. A channel whose publish did not end in
// a confirm (a timeout, a failed write) may still receive that publish's
// return, so it is closed rather than reused.
type publisher struct {
	conn    *amqp.Connection
	timeout time.Duration
	log     *slog.Logger
	// frameMax is the connection's negotiated frame size (0: no limit): a
	// copy's properties, its headers among them, must fit in one frame.
	frameMax int
	idle     chan *confirmChannel
	closing  sync.WaitGroup // channels being closed in the background
}

// confirmChannel is one channel of the pool, with its returns.
type confirmChannel struct {
	ch      *amqp.Channel
	returns chan amqp.Return
}

// newPublisher opens the first channel of a pool on conn (so a connection
// that cannot publish with confirms fails at once) and keeps up to idle
// channels open between publishes: the most copies published at once.
func newPublisher(conn *amqp.Connection, timeout time.Duration, idle int, log *slog.Logger) (*publisher, error) {
	p := &publisher{
		conn: conn, timeout: timeout, log: log,
		frameMax: conn.Config.FrameSize,
		idle:     make(chan *confirmChannel, max(idle, 1)),
	}
	cc, err := p.open()
	if err != nil {
		return nil, err
	}
	p.release(cc)
	return p, nil
}

func (p *publisher) open() (*confirmChannel, error) {
	ch, err := p.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("consumer: open publisher channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("consumer: put publisher channel in confirm mode: %w", err)
	}
	// One publish at a time, so at most one return is ever pending.
	return &confirmChannel{ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 1))}, nil
}

// acquire takes an idle open channel, or opens one.
func (p *publisher) acquire() (*confirmChannel, error) {
	for {
		select {
		case cc := <-p.idle:
			if cc.ch.IsClosed() {
				continue
			}
			return cc, nil
		default:
			return p.open()
		}
	}
}

// release puts cc back in the pool, or closes it when the pool is full.
func (p *publisher) release(cc *confirmChannel) {
	select {
	case p.idle <- cc:
	default:
		p.discard(cc)
	}
}

// discard closes cc in the background: on a blocked connection the close
// waits for the broker, and the publish that gave up on cc must not.
func (p *publisher) discard(cc *confirmChannel) {
	p.closing.Add(1)
	go func() {
		defer p.closing.Done()
		_ = cc.ch.Close()
	}()
}

// close closes the pooled channels and waits for those being closed. Call
// it after closing the connection, or with a connection that answers.
func (p *publisher) close() {
	for {
		select {
		case cc := <-p.idle:
			p.discard(cc)
			continue
		default:
		}
		break
	}
	p.closing.Wait()
}

// publish sends msg to queue through the default exchange and waits for the
// broker's confirm, bounded by the publish timeout. A nacked or returned
// copy is an error. Copies are published with mandatory set: a copy that no
// queue takes (its queue was deleted behind our back) is returned, and the
// publish fails (the original is requeued, never acked). A copy whose
// properties would not fit in one frame of the connection has its headers
// trimmed first ([fitFrame]).
func (p *publisher) publish(ctx context.Context, queue string, msg amqp.Publishing) error {
	if n := fitFrame(&msg, p.frameMax); n > 0 {
		p.log.LogAttrs(ctx, slog.LevelWarn, "consumer: a retry or dead-letter copy did not fit in one frame; headers dropped",
			slog.String("queue", queue), slog.String("message_id", msg.MessageId), slog.Int("dropped", n),
			slog.Int("frame_max", p.frameMax))
	}
	cc, err := p.acquire()
	if err != nil {
		return fmt.Errorf("consumer: publish to %q: %w", queue, err)
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	dc, err := cc.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, msg)
	if err != nil {
		p.discard(cc)
		return fmt.Errorf("consumer: publish to %q: %w", queue, err)
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		p.discard(cc)
		return fmt.Errorf("consumer: wait for confirm from %q: %w", queue, err)
	}
	var ret amqp.Return
	returned := false
	select {
	case ret, returned = <-cc.returns: // false if the channel closed
	default:
	}
	p.release(cc)
	if !ok {
		return fmt.Errorf("consumer: publish to %q: %w", queue, errNotConfirmed)
	}
	if returned {
		p.log.LogAttrs(ctx, slog.LevelError, "consumer: a retry or dead-letter copy was returned unroutable; its queue is missing",
			slog.String("queue", ret.RoutingKey), slog.String("message_id", ret.MessageId),
			slog.Int("reply_code", int(ret.ReplyCode)), slog.String("reply_text", ret.ReplyText))
		return fmt.Errorf("consumer: publish to %q: %w", queue, errReturned)
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

// maxClockSkew is how far in the future an incoming x-first-failed-at may
// lie and still be trusted: the copy may come from a worker on another host
// whose clock runs a little ahead.
const maxClockSkew = time.Minute

// failureHeaders copies h (trace context included) and then extra (the
// delivery's CopyHeaders) and adds the failure headers: x-error, first and
// last failure times and x-original-queue. The
// broker's own x-delivery-count is dropped (it counts per queue). An
// incoming x-first-failed-at is kept only from one of our own copies
// ([ownFirstFailure]); any other is replaced by now.
func failureHeaders(h, extra amqp.Table, queue, reason string, err error, now time.Time) amqp.Table {
	out := make(amqp.Table, len(h)+len(extra)+6)
	for k, v := range h {
		if k == inboxtype.HeaderDeliveryCount {
			continue
		}
		out[k] = v
	}
	for k, v := range extra {
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
	out[inboxtype.HeaderError] = text
	if first, ok := ownFirstFailure(h, queue, now); ok {
		out[inboxtype.HeaderFirstFailedAt] = first
	} else {
		out[inboxtype.HeaderFirstFailedAt] = ts
	}
	out[inboxtype.HeaderLastFailedAt] = ts
	out[inboxtype.HeaderOriginalQueue] = queue
	return out
}

// ownFirstFailure returns h's x-first-failed-at if h is one of our own
// copies of a delivery from queue (x-original-queue names it: a retry copy,
// or a dead letter replayed or released back) and the time is a valid RFC
// 3339 time not in the future. A producer could set the header to anything.
func ownFirstFailure(h amqp.Table, queue string, now time.Time) (string, bool) {
	if q, _ := h[inboxtype.HeaderOriginalQueue].(string); q != queue {
		return "", false
	}
	s, _ := h[inboxtype.HeaderFirstFailedAt].(string)
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || at.After(now.Add(maxClockSkew)) {
		return "", false
	}
	return s, true
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
