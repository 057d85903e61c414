package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/confirm"
	"github.com/inboxmq/inboxmq/retry"
)

// errReturned marks a copy that the broker confirmed but no queue took (its
// queue is missing): the copy is lost, so the original must not be acked.
var errReturned = errors.New("consumer: copy returned unroutable (its queue is missing)")

// publisher publishes the retry and dead-letter copies of one connection
// with publisher confirms and mandatory, on internal/confirm's pool of
// confirm-mode channels (one publish in flight per channel, so a return is
// matched to its publish by its channel, with no header on the copy).
type publisher struct {
	pool    *confirm.Pool
	timeout time.Duration
	log     *slog.Logger
	// frameMax is the connection's negotiated frame size (0: no limit): a
	// copy's properties, its headers among them, must fit in one frame.
	frameMax int
}

// newPublisher opens the first channel of a pool on conn (so a connection
// that cannot publish with confirms fails at once) and keeps up to idle
// channels open between publishes: the most copies published at once.
func newPublisher(conn *amqp.Connection, timeout time.Duration, idle int, log *slog.Logger) (*publisher, error) {
	pool, err := confirm.NewPool(conn, idle, 0)
	if err != nil {
		return nil, fmt.Errorf("consumer: publisher: %w", err)
	}
	return &publisher{pool: pool, timeout: timeout, log: log, frameMax: conn.Config.FrameSize}, nil
}

// close closes the pooled channels and waits for those being closed. Call
// it after closing the connection, or with a connection that answers.
func (p *publisher) close() { p.pool.Close() }

// publish sends msg to queue through the default exchange and waits for the
// broker's confirm, bounded by the publish timeout. A nacked or returned
// copy is an error. Copies are published with mandatory set: a copy that no
// queue takes (its queue was deleted behind our back) is returned, and the
// publish fails with errReturned in its chain (the original is requeued,
// never acked). A copy whose properties would not fit in one frame of the
// connection has its headers trimmed first ([fitFrame]).
func (p *publisher) publish(ctx context.Context, queue string, msg amqp.Publishing) error {
	return p.publishTo(ctx, "", queue, msg)
}

// publishTo is publish through exchange with routingKey (queue is then
// the routing key, for the logs and errors).
func (p *publisher) publishTo(ctx context.Context, exchange, queue string, msg amqp.Publishing) error {
	if n := fitFrame(&msg, p.frameMax); n > 0 {
		p.log.LogAttrs(ctx, slog.LevelWarn, "consumer: a retry or dead-letter copy did not fit in one frame; headers dropped",
			slog.String("queue", queue), slog.String("message_id", msg.MessageId), slog.Int("dropped", n),
			slog.Int("frame_max", p.frameMax))
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	err := p.pool.Publish(ctx, exchange, queue, true, msg)
	var ret *confirm.ReturnedError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ret):
		p.log.LogAttrs(ctx, slog.LevelError, "consumer: a retry or dead-letter copy was returned unroutable; its queue is missing",
			slog.String("queue", ret.Return.RoutingKey), slog.String("message_id", ret.Return.MessageId),
			slog.Int("reply_code", int(ret.Return.ReplyCode)), slog.String("reply_text", ret.Return.ReplyText))
		return fmt.Errorf("consumer: publish to %q: %w", queue, errReturned)
	case errors.Is(err, confirm.ErrNacked):
		return fmt.Errorf("consumer: publish to %q: broker did not confirm the publish: %w", queue, err)
	default:
		return fmt.Errorf("consumer: publish to %q: %w", queue, err)
	}
}

// maxErrorHeader bounds the x-error header.
const maxErrorHeader = 1024

// maxClockSkew is how far in the future an incoming x-first-failed-at may
// lie and still be trusted: the copy may come from a worker on another host
// whose clock runs a little ahead.
const maxClockSkew = time.Minute

// setFailureHeaders sets the failure headers on h, a copy of a delivery's
// headers ([envelope.Copy]: trace context included, the broker's
// x-delivery-count left out): first extra (the delivery's CopyHeaders),
// then x-error, first and last failure times and x-original-queue. An
// incoming x-first-failed-at is kept only from one of our own copies
// ([ownFirstFailure]); any other is replaced by now.
func setFailureHeaders(h, extra amqp.Table, queue, reason string, err error, now time.Time) {
	first, own := ownFirstFailure(h, queue, now)
	for k, v := range extra {
		h[k] = v
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
	h[inboxtype.HeaderError] = text
	if !own {
		first = ts
	}
	h[inboxtype.HeaderFirstFailedAt] = first
	h[inboxtype.HeaderLastFailedAt] = ts
	h[inboxtype.HeaderOriginalQueue] = queue
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
