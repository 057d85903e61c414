package confirm

import (
	"context"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Pool is a pool of confirm-mode channels on one connection. It is safe
// for concurrent use: each publish or batch in flight has a channel of its
// own.
type Pool struct {
	conn     *amqp.Connection
	frameMax int // the connection's negotiated frame size; 0: no limit
	idle     chan *channel
	slots    chan struct{} // nil: unbounded
	closing  sync.WaitGroup

	mu   sync.Mutex
	shut bool // Close was called: channels are closed at once
}

// channel is one channel of the pool, with its returns and close reason.
type channel struct {
	ch      *amqp.Channel
	returns chan amqp.Return
	closes  chan *amqp.Error
}

// returnsBuffer is the room for returns on a channel. A publish reads them
// while it waits for its confirms, so the room only spares amqp091's
// reader a wait; amqp091 drops a return it cannot hand over within 5s.
const returnsBuffer = 16

// NewPool opens the first channel of a pool on conn (so a connection that
// cannot publish with confirms fails at once) and keeps up to idle
// channels open between publishes. maxOpen bounds the channels open at
// once (publishes beyond it wait for one, bounded by their ctx); 0 means
// no bound.
func NewPool(conn *amqp.Connection, idle, maxOpen int) (*Pool, error) {
	p := &Pool{conn: conn, frameMax: conn.Config.FrameSize, idle: make(chan *channel, max(idle, 1))}
	if maxOpen > 0 {
		p.slots = make(chan struct{}, maxOpen)
		p.slots <- struct{}{}
	}
	cc, err := p.open()
	if err != nil {
		p.free()
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
	return &channel{
		ch:      ch,
		returns: ch.NotifyReturn(make(chan amqp.Return, returnsBuffer)),
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
