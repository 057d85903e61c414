package consumer

import (
	"context"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/confirm"
)

// SetTestHooks arms the fault-injection hooks of c (before Start). Either
// function may be nil.
func SetTestHooks(c *Consumer, beforeAck, afterPublish func(d *inboxtype.Delivery)) {
	c.hooks.Store(&testHooks{beforeAck: beforeAck, afterPublish: afterPublish})
}

// SetAckRoundHook arms the acker hook of c (before Start): it runs before
// each round of settlement frames with a count of the requests queued.
func SetAckRoundHook(c *Consumer, hook func(queued func() int)) {
	h := &testHooks{}
	if old := c.hooks.Load(); old != nil {
		*h = *old
	}
	h.beforeAckRound = hook
	c.hooks.Store(h)
}

// AckStats reports the settlement frames c wrote and the deliveries they
// settled.
func AckStats(c *Consumer) (frames, settled uint64) {
	return c.acks.frames.Load(), c.acks.settled.Load()
}

// ErrReturned is the error of a copy the broker returned unroutable.
var ErrReturned = errReturned

// CopyPublisher is the consumer's publisher of retry and dead-letter copies.
type CopyPublisher = publisher

// NewCopyPublisher builds the publisher of copies on conn, keeping up to
// idle channels.
func NewCopyPublisher(conn *amqp.Connection, timeout time.Duration, idle int) (*CopyPublisher, error) {
	return newPublisher(conn, timeout, idle, slog.New(slog.DiscardHandler))
}

// Publish publishes one copy and waits for its confirm.
func (p *publisher) Publish(ctx context.Context, queue string, msg amqp.Publishing) error {
	return p.publish(ctx, queue, msg)
}

// Close closes the publisher's channels.
func (p *publisher) Close() { p.close() }

// ContentHeaderSize is the size of msg's content header frame.
var ContentHeaderSize = confirm.ContentHeaderSize

// FitFrame trims msg's headers to fit a frame of frameMax bytes.
var FitFrame = fitFrame
