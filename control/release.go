package control

import (
	"context"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/confirm"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/envelope"
)

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
// republished (with confirm and mandatory, parked headers removed) and
// only then acked from the parked queue, so a crash in between duplicates
// a message but never loses one (the inbox absorbs the duplicate). A
// message that the broker returns (queue does not exist) stays parked, and
// Release fails. Messages that do not match opts stay parked, in order. It
// returns the number released.
func Release(ctx context.Context, conn *amqp.Connection, queue string, opts *ReleaseOpts) (int, error) {
	if !consumer.ValidName(queue) {
		return 0, fmt.Errorf("control: release: invalid queue name %q", queue)
	}
	parked := inboxtype.ParkedQueue(queue)
	ch, err := conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("control: release: channel: %w", err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclare(parked, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("control: release: declare %s: %w", parked, err)
	}
	pool, err := confirm.NewPool(conn, 1, 1)
	if err != nil {
		return 0, fmt.Errorf("control: release: %w", err)
	}
	defer pool.Close()
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
		msg := envelope.Copy(&d, func(h amqp.Table) {
			delete(h, inboxtype.HeaderParkedReason)
			delete(h, inboxtype.HeaderParkedAt)
			delete(h, inboxtype.HeaderParkedPattern)
		})
		if err := pool.Publish(ctx, "", queue, true, msg); err != nil {
			keep = append(keep, d.DeliveryTag)
			return released, fmt.Errorf("control: release: publish to %s: %w", queue, err)
		}
		if err := d.Ack(false); err != nil {
			return released, fmt.Errorf("control: release: ack: %w", err)
		}
		released++
	}
	return released, nil
}
