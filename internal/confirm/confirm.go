// Package confirm is inboxmq's one way to publish and wait for the
// broker's publisher confirms: the consumer's retry and dead-letter copies
// and its DLQ replay, the parker and Release, the outbox relay and package
// producer all publish through a [Pool] of confirm-mode channels of one
// connection.
//
// A publish ([Pool.Publish]) or a batch ([Pool.PublishBatch]) has a
// channel to itself from its first write to its last confirm, so every
// return and confirm on that channel is its own. The broker sends a
// message's basic.return before its confirm, and amqp091 hands both over
// in that order, so once a message is confirmed its return, if any, is
// there: a mandatory message returned and then confirmed is an error,
// never a success. Within a batch a return is matched to its message by
// destination and message id, in publish order. A channel whose publish
// did not end with every confirm in (a timeout, a failed write) may still
// receive that publish's return, so it is closed rather than reused.
//
// A message whose properties cannot fit in one frame of the connection is
// refused before it is written ([*TooLargeError]): the broker would close
// the connection on it, and with it every other publish in flight.
//
// A batch may be written to the socket at once: given a [Holder] (the
// connection's amqpdial.HoldConn), its publishes are queued while amqp091
// frames them and go out in one write.
package confirm

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// TooLargeError is returned for a message whose content header (its
// properties and headers, [ContentHeaderSize]) exceeds the connection's
// frame size. It was not sent: sending it would make the broker close the
// connection.
type TooLargeError struct {
	Size, FrameMax int
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("its properties and headers take %d bytes, more than the connection's frame size of %d", e.Size, e.FrameMax)
}

// Message is one message of a batch.
type Message struct {
	Exchange, RoutingKey string
	// Mandatory asks the broker to return the message if no queue takes
	// it: the message then fails with a [*ReturnedError].
	Mandatory  bool
	Publishing amqp.Publishing
}

// Holder holds the socket writes of a connection: between Hold and
// Release, what amqp091 writes is queued, and Release writes it at once,
// returning the write's error. amqpdial.HoldConn is one.
type Holder interface {
	Hold()
	Release() error
}

// Publish sends msg and waits for the broker's confirm, bounded by ctx. It
// returns nil once the broker confirmed the message (and, with mandatory,
// did not return it), [ErrNacked] for a nack, a [*ReturnedError] for a
// mandatory message no queue took, a [*ClosedError] when the channel
// closed first, a [*TooLargeError] for a message that cannot be sent, or
// the error of the write or of ctx. Errors are not prefixed: the caller
// names its package and destination.
func (p *Pool) Publish(ctx context.Context, exchange, routingKey string, mandatory bool, msg amqp.Publishing) error {
	errs, _ := p.PublishBatch(ctx, []Message{{Exchange: exchange, RoutingKey: routingKey, Mandatory: mandatory, Publishing: msg}}, nil)
	return errs[0]
}

// PublishBatch sends msgs in order on one channel and waits for all their
// confirms, bounded by ctx. With hold set, the publishes are queued while
// amqp091 frames them and written at once when the last is framed; nothing
// inside the hold waits for the broker.
//
// errs has one entry per message, with [Pool.Publish]'s meaning: nil for a
// confirmed message; [ErrNacked] or a [*ReturnedError] for one the broker
// refused; a [*TooLargeError] for one not sent; and err for one with no
// answer. err says why the batch ended without every answer, or left its
// channel unusable: a failed write or publish (a header amqp091 cannot
// encode ends the batch there), a closed channel, ctx's end. It is nil
// when every message got its answer.
func (p *Pool) PublishBatch(ctx context.Context, msgs []Message, hold Holder) (errs []error, err error) {
	errs = make([]error, len(msgs))
	if len(msgs) == 0 {
		return errs, nil
	}
	cc, err := p.acquire(ctx)
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs, err
	}
	if err := cc.publish(ctx, msgs, hold, p.frameMax, errs); err != nil || cc.ch.IsClosed() {
		p.discard(cc)
		return errs, err
	}
	p.release(cc)
	return errs, nil
}

// publish sends msgs on cc, waits for their confirms and sets errs (see
// PublishBatch). It returns the batch's error.
func (cc *channel) publish(ctx context.Context, msgs []Message, hold Holder, frameMax int, errs []error) error {
	dcs := make([]*amqp.DeferredConfirmation, len(msgs))
	var err error
	if hold != nil {
		hold.Hold()
	}
	for i := range msgs {
		m := &msgs[i]
		if errs[i] = check(&m.Publishing, frameMax); errs[i] != nil {
			continue
		}
		dcs[i], err = cc.ch.PublishWithDeferredConfirmWithContext(ctx, m.Exchange, m.RoutingKey, m.Mandatory, false, m.Publishing)
		if err != nil {
			break // the channel or connection failed: the rest is not sent
		}
	}
	if hold != nil {
		if werr := hold.Release(); werr != nil {
			// Nothing of the batch reached the broker: no confirm will come.
			err = errors.Join(err, fmt.Errorf("write the batch: %w", werr))
			for i := range dcs {
				if errs[i] == nil {
					errs[i] = err
				}
			}
			return err
		}
	}

	returns := cc.returns
	var rets []amqp.Return
	for _, dc := range dcs {
		if dc == nil {
			continue
		}
		if werr := waitFor(ctx, dc, &returns, &rets); werr != nil {
			err = errors.Join(err, werr)
			break
		}
	}
	for returns != nil { // every return of a confirmed message is queued by now
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				break
			}
			rets = append(rets, r)
		default:
			returns = nil
		}
	}
	// A closing channel resolves its pending confirms as nacks: that is
	// "no answer", not the broker's nack.
	// A publish after the broker closed the channel fails with
	// amqp.ErrClosed, before the close's reason may have reached us: that is
	// the same closed channel.
	closed := cc.ch.IsClosed()
	if closed && (err == nil || errors.Is(err, amqp.ErrClosed)) {
		err = &ClosedError{Reason: cc.closeReason(ctx)}
	}

	returned := match(msgs, dcs, rets)
	for i, dc := range dcs {
		switch {
		case errs[i] != nil: // refused before the write
		case dc == nil || !done(dc): // not sent, or no answer yet
			errs[i] = err
		case !dc.Acked() && closed:
			errs[i] = err
		case !dc.Acked():
			errs[i] = ErrNacked
		case returned != nil && returned[i] != nil:
			errs[i] = &ReturnedError{Return: *returned[i]}
		}
	}
	return err
}

// check refuses a message whose properties cannot fit in one frame.
func check(msg *amqp.Publishing, frameMax int) error {
	if frameMax > 0 {
		if n := ContentHeaderSize(msg); n > frameMax {
			return &TooLargeError{Size: n, FrameMax: frameMax}
		}
	}
	return nil
}

// waitFor waits for dc's confirm, bounded by ctx, and meanwhile collects
// the returns arriving on *returns into *rets, so that a batch with many
// returns never makes amqp091's reader wait for room.
func waitFor(ctx context.Context, dc *amqp.DeferredConfirmation, returns *chan amqp.Return, rets *[]amqp.Return) error {
	for {
		select {
		case <-dc.Done():
			return nil
		case r, ok := <-*returns:
			if !ok {
				*returns = nil // the channel closed: its confirms resolve as nacks
				continue
			}
			*rets = append(*rets, r)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// closeReason returns the broker's reason for closing cc, nil when the
// channel closed with its connection. amqp091 marks a channel closed
// before it hands over the reason, so it waits for the reason, bounded by
// ctx and by closeWait.
func (cc *channel) closeReason(ctx context.Context) *amqp.Error {
	t := time.NewTimer(closeWait)
	defer t.Stop()
	select {
	case reason := <-cc.closes:
		return reason
	case <-ctx.Done():
	case <-t.C:
	}
	return nil
}

// closeWait bounds the wait for a closed channel's reason: amqp091 hands
// it over within its shutdown, without waiting for the network.
const closeWait = time.Second

func done(dc *amqp.DeferredConfirmation) bool {
	select {
	case <-dc.Done():
		return true
	default:
		return false
	}
}

// match assigns each return to the first message sent with mandatory to
// the same exchange and routing key, with the same message id, not yet
// matched: the broker returns messages in publish order. It returns nil
// when there is no return.
func match(msgs []Message, dcs []*amqp.DeferredConfirmation, rets []amqp.Return) []*amqp.Return {
	if len(rets) == 0 {
		return nil
	}
	returned := make([]*amqp.Return, len(msgs))
	for k := range rets {
		r := &rets[k]
		for i := range msgs {
			m := &msgs[i]
			if dcs[i] != nil && returned[i] == nil && m.Mandatory &&
				m.Exchange == r.Exchange && m.RoutingKey == r.RoutingKey && m.Publishing.MessageId == r.MessageId {
				returned[i] = r
				break
			}
		}
	}
	return returned
}
