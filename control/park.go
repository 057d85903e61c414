package control

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/inboxtype"
)

// Headers set on a parked message (its other headers and properties are
// kept as they were).
const (
	// HeaderParkedReason is the block's reason (or "blocked").
	HeaderParkedReason = "x-parked-reason"
	// HeaderParkedAt is when the message was parked (RFC 3339).
	HeaderParkedAt = "x-parked-at"
	// HeaderParkedPattern is the blocked key or prefix that matched.
	HeaderParkedPattern = "x-parked-pattern"
)

// ParkedQueueName is the queue where blocked deliveries of queue wait:
// "<queue>.parked". It is a durable classic queue declared on first use.
func ParkedQueueName(queue string) string { return queue + ".parked" }

// Parker publishes blocked deliveries to their queue's parked queue with
// publisher confirms. It owns one confirm-mode channel on conn, opened on
// first use and reopened after a failure. Parker is safe for concurrent use;
// publishes are serialised.
type Parker struct {
	conn *amqp.Connection

	mu       sync.Mutex
	ch       *amqp.Channel
	declared map[string]bool
}

// NewParker returns a parker publishing on conn. It does not open a channel
// until the first Park.
func NewParker(conn *amqp.Connection) *Parker {
	return &Parker{conn: conn, declared: make(map[string]bool)}
}

// Park copies d to ParkedQueueName(d.Queue), with the parked headers and
// the idempotency key header, and returns once the broker confirmed it. The
// caller (the Block middleware) then lets the consumer ack the original.
func (p *Parker) Park(ctx context.Context, d *inboxtype.Delivery, b Block) error {
	if !consumer.ValidName(d.Queue) {
		return fmt.Errorf("control: park: invalid queue name %q", d.Queue)
	}
	headers := amqp.Table{}
	for k, v := range d.Headers {
		headers[k] = v
	}
	headers[HeaderParkedReason] = cmp.Or(b.Reason, "blocked")
	headers[HeaderParkedPattern] = b.Pattern
	headers[HeaderParkedAt] = time.Now().UTC().Format(time.RFC3339)
	headers[inboxtype.HeaderOriginalQueue] = d.Queue
	if d.Key != "" {
		headers[inboxtype.HeaderIdempotencyKey] = d.Key
	}
	msg := amqp.Publishing{Headers: headers, Body: d.Body, DeliveryMode: amqp.Persistent, MessageId: d.MessageID}
	if raw := d.Raw; raw != nil {
		msg.ContentType, msg.ContentEncoding = raw.ContentType, raw.ContentEncoding
		msg.CorrelationId, msg.Type, msg.AppId = raw.CorrelationId, raw.Type, raw.AppId
		msg.Timestamp = raw.Timestamp
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	return p.publishLocked(ctx, ParkedQueueName(d.Queue), msg)
}

func (p *Parker) publishLocked(ctx context.Context, queue string, msg amqp.Publishing) error {
	if p.ch == nil || p.ch.IsClosed() {
		ch, err := p.conn.Channel()
		if err != nil {
			return fmt.Errorf("control: park: channel: %w", err)
		}
		if err := ch.Confirm(false); err != nil {
			_ = ch.Close()
			return fmt.Errorf("control: park: confirm mode: %w", err)
		}
		p.ch = ch
		p.declared = make(map[string]bool)
	}
	if !p.declared[queue] {
		if _, err := p.ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
			p.ch = nil
			return fmt.Errorf("control: park: declare %s: %w", queue, err)
		}
		p.declared[queue] = true
	}
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, msg)
	if err != nil {
		return fmt.Errorf("control: park: publish: %w", err)
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return errors.Join(errors.New("control: park: confirm"), err)
	}
	if !ok {
		return errors.New("control: park: broker nacked the parked message")
	}
	return nil
}

// Close closes the parker's channel (not the connection).
func (p *Parker) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ch == nil {
		return nil
	}
	err := p.ch.Close()
	p.ch = nil
	if err != nil && !errors.Is(err, amqp.ErrClosed) {
		return fmt.Errorf("control: close parker: %w", err)
	}
	return nil
}

// ReleaseOpts select which parked messages [Release] moves. A nil
// *ReleaseOpts releases every parked message of the queue.
type ReleaseOpts struct {
	// Key releases only messages with this idempotency key (or, with
	// Prefix, keys starting with it). Defaults to "" (all).
	Key string
	// Prefix makes Key a prefix.
	Prefix bool
	// Limit caps the number of messages inspected. Defaults to every message
	// in the parked queue when Release starts.
	Limit int
}

func (o *ReleaseOpts) match(key string) bool {
	if o == nil || o.Key == "" {
		return true
	}
	if o.Prefix {
		return strings.HasPrefix(key, o.Key)
	}
	return key == o.Key
}

// Release moves parked messages of queue back to queue: each one is
// republished (with confirm, parked headers removed) and only then acked
// from the parked queue, so a crash in between duplicates a message but
// never loses one (the inbox absorbs the duplicate). Messages that do not
// match opts stay parked, in order. It returns the number released.
func Release(ctx context.Context, conn *amqp.Connection, queue string, opts *ReleaseOpts) (int, error) {
	if !consumer.ValidName(queue) {
		return 0, fmt.Errorf("control: release: invalid queue name %q", queue)
	}
	parked := ParkedQueueName(queue)
	ch, err := conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("control: release: channel: %w", err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclare(parked, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("control: release: declare %s: %w", parked, err)
	}
	if err := ch.Confirm(false); err != nil {
		return 0, fmt.Errorf("control: release: confirm mode: %w", err)
	}
	limit := q.Messages
	if opts != nil && opts.Limit > 0 {
		limit = min(limit, opts.Limit)
	}
	released := 0
	var keep []uint64
	defer func() {
		// Unmatched messages go back to the parked queue (head first).
		for _, tag := range keep {
			_ = ch.Nack(tag, false, true)
		}
	}()
	for range limit {
		if err := ctx.Err(); err != nil {
			return released, err
		}
		d, ok, err := ch.Get(parked, false)
		if err != nil {
			return released, fmt.Errorf("control: release: get: %w", err)
		}
		if !ok {
			break
		}
		key, _ := d.Headers[inboxtype.HeaderIdempotencyKey].(string)
		if !opts.match(key) {
			keep = append(keep, d.DeliveryTag)
			continue
		}
		headers := amqp.Table{}
		for k, v := range d.Headers {
			headers[k] = v
		}
		delete(headers, HeaderParkedReason)
		delete(headers, HeaderParkedAt)
		delete(headers, HeaderParkedPattern)
		msg := amqp.Publishing{
			Headers: headers, Body: d.Body, DeliveryMode: amqp.Persistent, MessageId: d.MessageId,
			ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, CorrelationId: d.CorrelationId,
			Type: d.Type, AppId: d.AppId, Timestamp: d.Timestamp,
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, msg)
		if err != nil {
			return released, fmt.Errorf("control: release: publish: %w", err)
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return released, errors.Join(fmt.Errorf("control: release: publish to %s not confirmed", queue), err)
		}
		if err := d.Ack(false); err != nil {
			return released, fmt.Errorf("control: release: ack: %w", err)
		}
		released++
	}
	return released, nil
}
