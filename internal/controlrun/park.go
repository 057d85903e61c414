package controlrun

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/confirm"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/envelope"
)

// Parker publishes blocked deliveries to their queue's parked queue with
// publisher confirms, on one confirm-mode channel on conn, opened at the
// first Park and opened again after a failure. It is safe for concurrent
// use; publishes take turns on the channel.
type Parker struct {
	conn *amqp.Connection

	mu       sync.Mutex
	pool     *confirm.Pool
	declared map[string]bool
}

// NewParker returns a parker publishing on conn. It does not open a channel
// until the first Park.
func NewParker(conn *amqp.Connection) *Parker {
	return &Parker{conn: conn, declared: make(map[string]bool)}
}

// Park copies d to [inboxtype.ParkedQueue](d.Queue), with the parked
// headers and the idempotency key header, and returns once the broker
// confirmed it. The caller (the Block middleware) then lets the consumer
// ack the original. A copy that the broker returns (its parked queue was
// deleted) is an error: the next Park declares the queue again.
func (p *Parker) Park(ctx context.Context, d *inboxtype.Delivery, b control.Block) error {
	if !consumer.ValidName(d.Queue) {
		return fmt.Errorf("controlrun: park: invalid queue name %q", d.Queue)
	}
	raw := d.Raw
	if raw == nil {
		raw = &amqp.Delivery{MessageId: d.MessageID, Headers: d.Headers, Body: d.Body}
	}
	msg := envelope.Copy(raw, func(h amqp.Table) {
		h[inboxtype.HeaderParkedReason] = cmp.Or(b.Reason, "blocked")
		h[inboxtype.HeaderParkedPattern] = b.Pattern
		h[inboxtype.HeaderParkedAt] = time.Now().UTC().Format(time.RFC3339)
		h[inboxtype.HeaderOriginalQueue] = d.Queue
		if d.Key != "" {
			h[inboxtype.HeaderIdempotencyKey] = d.Key
		}
	})
	queue := inboxtype.ParkedQueue(d.Queue)
	pool, err := p.ready(queue)
	if err != nil {
		return err
	}
	err = pool.Publish(ctx, "", queue, true, msg)
	var ret *confirm.ReturnedError
	if errors.As(err, &ret) {
		p.mu.Lock()
		delete(p.declared, queue)
		p.mu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("controlrun: park to %s: %w", queue, err)
	}
	return nil
}

// ready returns the parker's pool, opening it on first use, once queue is
// declared.
func (p *Parker) ready(queue string) (*confirm.Pool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pool == nil {
		pool, err := confirm.NewPool(p.conn, 1, 1)
		if err != nil {
			return nil, fmt.Errorf("controlrun: park: %w", err)
		}
		p.pool = pool
	}
	if !p.declared[queue] {
		if err := declare(p.conn, queue); err != nil {
			return nil, fmt.Errorf("controlrun: park: %w", err)
		}
		p.declared[queue] = true
	}
	return p.pool, nil
}

// declare declares a parked queue (durable, classic) on a channel of its
// own.
func declare(conn *amqp.Connection, queue string) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare %s: %w", queue, err)
	}
	return nil
}

// Close closes the parker's channels (not the connection).
func (p *Parker) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pool != nil {
		p.pool.Close()
		p.pool = nil
		p.declared = make(map[string]bool)
	}
	return nil
}
