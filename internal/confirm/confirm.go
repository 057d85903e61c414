// Package confirm publishes AMQP messages with publisher confirms and the
// mandatory flag, one message in flight per channel, on a pool of
// confirm-mode channels of one connection. It is the one publish-and-wait
// mechanism of the consumer's retry and dead-letter copies and of package
// producer; the outbox relay pipelines whole batches on a channel of its
// own instead.
//
// Each channel carries one publish at a time: the broker sends a message's
// basic.return before its confirm on the same channel, and amqp091 hands
// both over in that order, so a return waiting on the channel once the
// confirm arrived belongs to that publish. No header is needed to match a
// return to its publish. A channel whose publish did not end in a confirm
// (a timeout, a failed write) may still receive that publish's return, so
// it is closed rather than reused.
package confirm

import (
	"context"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrNacked is returned when the broker nacks a publish: it did not take
// responsibility for the message (an internal error, a full quorum queue
// with reject-publish).
var ErrNacked = errors.New("broker nacked the publish")

// ReturnedError is returned when the broker returned a mandatory message
// that no queue took (basic.return), and then confirmed it: the message is
// lost.
type ReturnedError struct {
	Return amqp.Return
}

func (e *ReturnedError) Error() string {
	return fmt.Sprintf("returned unroutable (%d %s): exchange %q, routing key %q",
		e.Return.ReplyCode, e.Return.ReplyText, e.Return.Exchange, e.Return.RoutingKey)
}

// ClosedError is returned when the channel closed before the broker
// confirmed the publish: whether the message was taken is unknown. Reason
// is the broker's reason for closing the channel, nil when the channel
// closed with its connection (a lost network, a closed connection).
type ClosedError struct {
	Reason *amqp.Error
}

func (e *ClosedError) Error() string {
	if e.Reason == nil {
		return "channel closed before the confirm"
	}
	return "channel closed before the confirm: " + e.Reason.Error()
}

func (e *ClosedError) Unwrap() error {
	if e.Reason == nil {
		return amqp.ErrClosed
	}
	return e.Reason
}

// Pool is a pool of confirm-mode channels on one connection. It is safe
// for concurrent use.
type Pool struct {
	conn    *amqp.Connection
	idle    chan *channel
	slots   chan struct{} // nil: unbounded
	closing sync.WaitGroup

	mu   sync.Mutex
	shut bool // Close was called: channels are closed at once
}

// channel is one channel of the pool, with its returns and close reason.
type channel struct {
	ch      *amqp.Channel
	returns chan amqp.Return
	closes  chan *amqp.Error
}

// NewPool opens the first channel of a pool on conn (so a connection that
// cannot publish with confirms fails at once) and keeps up to idle
// channels open between publishes. maxOpen bounds the channels open at
// once (publishes beyond it wait for one, bounded by their ctx); 0 means
// no bound.
func NewPool(conn *amqp.Connection, idle, maxOpen int) (*Pool, error) {
	p := &Pool{conn: conn, idle: make(chan *channel, max(idle, 1))}
	if maxOpen > 0 {
		p.slots = make(chan struct{}, maxOpen)
		p.slots <- struct{}{}
	}
	cc, err := p.open()
	if err != nil {
		return nil, err
	}
	p.release(cc)
	return p, nil
}

func (p *Pool) open() (*channel, error) {
	ch, err := p.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("put channel in confirm mode: %w", err)
	}
	// One publish at a time, so at most one return is ever pending.
	return &channel{
		ch:      ch,
		returns: ch.NotifyReturn(make(chan amqp.Return, 1)),
		closes:  ch.NotifyClose(make(chan *amqp.Error, 1)),
	}, nil
}

// acquire takes an idle open channel, or opens one (waiting for a slot
// when the pool is bounded).
func (p *Pool) acquire(ctx context.Context) (*channel, error) {
	for {
		select {
		case cc := <-p.idle:
			if cc.ch.IsClosed() {
				p.free()
				continue
			}
			return cc, nil
		default:
		}
		if p.slots == nil {
			return p.open()
		}
		select {
		case cc := <-p.idle:
			if cc.ch.IsClosed() {
				p.free()
				continue
			}
			return cc, nil
		case p.slots <- struct{}{}:
			cc, err := p.open()
			if err != nil {
				p.free()
			}
			return cc, err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// free gives back the slot of a channel that is gone.
func (p *Pool) free() {
	if p.slots != nil {
		<-p.slots
	}
}

// release puts cc back in the pool, or closes it when the pool is full.
func (p *Pool) release(cc *channel) {
	p.mu.Lock()
	shut := p.shut
	p.mu.Unlock()
	if shut {
		p.discard(cc)
		return
	}
	select {
	case p.idle <- cc:
	default:
		p.discard(cc)
	}
}

// discard closes cc in the background: on a blocked connection the close
// waits for the broker, and the publish that gave up on cc must not. After
// Close it closes cc at once.
func (p *Pool) discard(cc *channel) {
	p.mu.Lock()
	if p.shut {
		p.mu.Unlock()
		_ = cc.ch.Close()
		p.free()
		return
	}
	p.closing.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.closing.Done()
		defer p.free()
		_ = cc.ch.Close()
	}()
}

// Close closes the pooled channels and waits for those being closed. Call
// it after closing the connection, or with a connection that answers. It
// may run while publishes are in flight (their channels close as they
// end).
func (p *Pool) Close() {
	p.mu.Lock()
	p.shut = true
	p.mu.Unlock()
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

// Publish sends msg and waits for the broker's confirm, bounded by ctx. It
// returns nil once the broker confirmed the message (and, with mandatory,
// did not return it), [ErrNacked] for a nack, a [*ReturnedError] for a
// mandatory message no queue took, a [*ClosedError] when the channel
// closed first, or the error of the write or of ctx. Errors are not
// prefixed: the caller names its package and destination.
func (p *Pool) Publish(ctx context.Context, exchange, routingKey string, mandatory bool, msg amqp.Publishing) error {
	cc, err := p.acquire(ctx)
	if err != nil {
		return err
	}
	dc, err := cc.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, routingKey, mandatory, false, msg)
	if err != nil {
		p.discard(cc)
		return err
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		p.discard(cc)
		return err
	}
	var ret amqp.Return
	returned := false
	select {
	case ret, returned = <-cc.returns: // false if the channel closed
	default:
	}
	if !ok && cc.ch.IsClosed() {
		// A closing channel resolves its pending confirms as nacks: that
		// is "no answer", not the broker's nack.
		var reason *amqp.Error
		select {
		case reason = <-cc.closes:
		default:
		}
		p.discard(cc)
		return &ClosedError{Reason: reason}
	}
	p.release(cc)
	if !ok {
		return ErrNacked
	}
	if returned {
		return &ReturnedError{Return: ret}
	}
	return nil
}
