package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// Messages the broker dead-letters from a route's queue (they expired,
// passed a quorum queue's delivery limit, were rejected or pushed out by
// a length limit) land in the route's dead queue (deadQueueName), not in
// the DLQ. Each session consumes the dead queue in one loop of its own
// and files every message into the DLQ through the same settlement as a
// handler's permanent failure: the copy carries the broker's reason in
// x-error (reason "broker_<x-death reason>"), the route's OnDeadLetter
// hook runs, the observers see a dead letter, and the message leaves the
// dead queue only once its copy is confirmed. No handler runs. The loop
// keeps filing while the route is paused: a filing has no business effect.

// deadPrefetch bounds the dead letters a session holds at once: they are
// filed one after another, off the route's worker pool.
const deadPrefetch = 8

// openDead starts route r's dead-queue loop on session s. A route whose
// topology the consumer does not declare (QueueOpts.NoDeclare) and whose
// dead queue does not exist has none.
func (s *session) openDead(r *route) error {
	queue := deadQueueName(r.Queue)
	if r.Opts.Queue.NoDeclare && !queueExists(s.conn, queue) {
		s.c.log.LogAttrs(context.Background(), slog.LevelInfo, "consumer: no dead queue: messages the broker dead-letters go where the queue's own arguments send them",
			slog.String("queue", r.Queue), slog.String("dead_queue", queue))
		return nil
	}
	ch, err := s.conn.Channel()
	if err != nil {
		return fmt.Errorf("consumer: open channel for %q: %w", queue, err)
	}
	if err := ch.Qos(deadPrefetch, 0, false); err != nil {
		return fmt.Errorf("consumer: set prefetch on %q: %w", queue, err)
	}
	s.watch("channel of "+queue, ch.NotifyClose(make(chan *amqp.Error, 1)))
	s.watchCancel(queue, ch.NotifyCancel(make(chan string, 1)))
	tag := s.c.consumerTag(queue)
	deliveries, err := ch.Consume(queue, tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consumer: consume %q: %w", queue, err)
	}
	s.c.filers.Add(1)
	go s.deadLoop(r, ch, tag, deliveries)
	return nil
}

// deadLoop files the dead queue's messages one by one until Stop or the
// session's end. It is one of the consumer's filers, not of the session's
// loops: a failed session's close does not wait for a filing stuck in
// OnDeadLetter past its bound, and the loop ends by itself once that
// filing returns (its deliveries end with the connection).
func (s *session) deadLoop(r *route, ch *amqp.Channel, tag string, deliveries <-chan amqp.Delivery) {
	defer s.c.filers.Done()
	acks := newAcker(ch, &s.c.acks)
	for {
		select { // Stop wins over a ready delivery
		case <-s.stopConsuming:
			s.cancel(ch, acks, tag, deliveries, nil)
			return
		default:
		}
		select {
		case raw, ok := <-deliveries:
			if !ok {
				s.fail(fmt.Errorf("consumer: deliveries of %q ended (channel closed or consumer cancelled)", deadQueueName(r.Queue)))
				return
			}
			acks.track(raw.DeliveryTag)
			j := job{raw: raw, sess: s, acks: acks, dead: true}
			s.c.progress.begin()
			s.c.file(r, &j)
			s.c.progress.end()
		case <-s.stopConsuming:
			s.cancel(ch, acks, tag, deliveries, nil)
			return
		case <-s.failed:
			return
		}
	}
}

// file settles one message of the route's dead queue: it is dead-lettered
// into the DLQ with the broker's reason (see the top of this file).
func (c *Consumer) file(r *route, j *job) inboxtype.Action {
	d := inboxtype.NewDelivery(r.Queue, r.Opts.Namespace, c.cfg.Name, &j.raw, c.cfg.Observers...)
	settled := d.Own()
	if !c.holdBack(r, j, d) {
		d.Transition(inboxtype.StatusReceived, nil)
		return c.settle(r, j, d, settled, retry.Decision{Kind: retry.KindInterrupted, Reason: "stopped"}, runs{})
	}
	c.keyOf(r, d)
	d.Transition(inboxtype.StatusReceived, nil)
	death := lastDeath(j.raw.Headers)
	reason := "broker"
	if death.reason != "" {
		reason += "_" + death.reason
	}
	err := fmt.Errorf("consumer: the broker dead-lettered the message from %q: %s", death.queue, death.reason)
	if death.reason == "" {
		err = errors.New("consumer: the broker dead-lettered the message (no x-death header)")
	}
	dec := retry.Decision{Kind: retry.KindPermanent, Reason: reason, Err: err}
	return c.settle(r, j, d, settled, dec, runs{})
}

// keyOf sets d.Key from its payload when it decodes to a keyed value; a
// payload that does not (the reason it is dead, perhaps) leaves it empty.
// A panic in the codec leaves it empty too.
func (c *Consumer) keyOf(r *route, d *inboxtype.Delivery) {
	if r.keyOf == nil {
		return
	}
	defer func() {
		if p := recover(); p != nil {
			c.log.LogAttrs(context.Background(), slog.LevelWarn, "consumer: decoding a dead letter's key panicked; filed without its key",
				slog.String("queue", r.Queue), slog.String("message_id", d.MessageID), slog.Any("panic", p))
		}
	}()
	r.keyOf(d)
}

// death is the broker's most recent dead-lettering of a message.
type death struct {
	reason, queue, routingKey string
}

// lastDeath reads the most recent entry of x-death (the broker puts it
// first): why and from which queue the broker dead-lettered the message,
// and the routing key it had then. A message without one yields a zero
// death.
func lastDeath(h amqp.Table) death {
	deaths, _ := h["x-death"].([]any)
	if len(deaths) == 0 {
		return death{}
	}
	t, ok := deaths[0].(amqp.Table)
	if !ok {
		return death{}
	}
	var out death
	out.reason, _ = t["reason"].(string)
	out.queue, _ = t["queue"].(string)
	if keys, _ := t["routing-keys"].([]any); len(keys) > 0 {
		out.routingKey, _ = keys[0].(string)
	}
	return out
}
