package consumer

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/envelope"
	"github.com/inboxmq/inboxmq/retry"
)

// DeadLetter describes a dead-letter settlement to HandlerOpts.OnDeadLetter:
// the delivery, the decision it was settled on, and the headers of its
// copy in the DLQ (x-error, x-attempt, x-first-failed-at, x-last-failed-at,
// x-original-queue, x-idempotency-key).
type DeadLetter struct {
	// Delivery is the dead-lettered delivery.
	Delivery *inboxtype.Delivery
	// Decision is the verdict it was settled on (reason exhausted when the
	// retry policy allowed no further attempt).
	Decision retry.Decision
	// Headers are the headers of the copy confirmed in the DLQ.
	Headers amqp.Table
}

// runOnDeadLetter runs the route's OnDeadLetter hook, if any, for the
// copy just confirmed in the DLQ.
func (r *route) runOnDeadLetter(ctx context.Context, d *inboxtype.Delivery, dec retry.Decision, h amqp.Table) error {
	f := r.Opts.OnDeadLetter
	if f == nil {
		return nil
	}
	return f(ctx, DeadLetter{Delivery: d, Decision: dec, Headers: h})
}

// OrderingKey is the ordering key of a dead letter of an ordered route,
// and "" on other routes.
func (dl DeadLetter) OrderingKey() string {
	k, _ := dl.Headers[headerOrderingKey].(string)
	return k
}

// Replay returns the message as [ReplayDLQ] would publish its dead letter
// again: its headers without the failure headers, x-attempt 1 and
// x-replay-count counted.
func (dl DeadLetter) Replay() amqp.Publishing {
	return envelope.Copy(dl.Delivery.Raw, func(h amqp.Table) {
		clear(h)
		for k, v := range dl.Headers {
			h[k] = v
		}
		setReplayHeaders(h, inboxtype.HeaderInt(dl.Headers, inboxtype.HeaderReplayCount))
	})
}
