package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// ReplyOpts makes a handler answer requests (RabbitMQ RPC): a delivery that
// carries reply_to and ends completed or as a duplicate gets a reply before
// it is acked, published to reply_to through the default exchange with the
// delivery's own correlation_id, content type application/json and the
// job's result as body (JSON null when there is none), with the broker's
// confirm; a duplicate's reply carries
// inboxtype.HeaderReplayedOutcome (true). The reply follows the commit, so it never announces an effect
// that did not commit; it precedes the ack, so a reply that could not be
// published (no confirm, a broken connection) requeues the delivery, which
// comes back as a duplicate and replies then. A reply that no queue takes
// (the caller is gone) is logged and the delivery acked. A failed
// delivery gets no reply.
type ReplyOpts struct {
	// Result returns the body of the reply to d, a delivery that completed
	// (dec.Kind retry.KindSucceeded) or was a duplicate. An error requeues
	// the delivery (see above). Defaults to d.Result, where the inbox's
	// handlers leave the bytes stored on the key's row: the same for the
	// first delivery and every duplicate. A duplicate caught before the
	// inbox (a hit of middleware.Cache) holds none; to reply with the
	// stored result then, read the row here (inbox.Store.Get).
	Result func(ctx context.Context, d *inboxtype.Delivery, dec retry.Decision) (json.RawMessage, error)
}

// reply publishes the reply to a request d settled on dec, if its route
// answers requests. It returns an error only if the delivery must not be
// acked: the reply may be published again.
func (c *Consumer) reply(r *route, j *job, d *inboxtype.Delivery, dec retry.Decision) error {
	o := r.Opts.Reply
	if o == nil || j.raw.ReplyTo == "" {
		return nil
	}
	body := d.Result
	if o.Result != nil {
		var err error
		if body, err = o.Result(c.baseCtx, d, dec); err != nil {
			return err
		}
	}
	if body == nil {
		body = json.RawMessage("null")
	}
	msg := amqp.Publishing{
		ContentType:   "application/json",
		CorrelationId: j.raw.CorrelationId,
		Body:          body,
	}
	if d.Key != "" || dec.Kind == retry.KindDuplicate {
		msg.Headers = make(amqp.Table, 2)
	}
	if d.Key != "" {
		msg.Headers[inboxtype.HeaderIdempotencyKey] = d.Key
	}
	if dec.Kind == retry.KindDuplicate {
		// The job did not run again: the caller can tell this answer
		// from a first one.
		msg.Headers[inboxtype.HeaderReplayedOutcome] = true
	}
	err := j.sess.pub.publish(c.baseCtx, j.raw.ReplyTo, msg)
	if errors.Is(err, errReturned) {
		c.log.LogAttrs(context.Background(), slog.LevelWarn, "consumer: a reply was returned unroutable; the caller's reply queue is gone",
			slog.String("queue", r.Queue), slog.String("message_id", d.MessageID),
			slog.String("reply_to", j.raw.ReplyTo), slog.String("correlation_id", j.raw.CorrelationId))
		return nil
	}
	return err
}
