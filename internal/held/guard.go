package held

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/envelope"
	"github.com/inboxmq/inboxmq/retry"
)

// Guard returns router-wide middleware that keeps the order of held keys
// on the strict ordered routes of namespaces; deliveries of other
// namespaces pass. It runs before decoding, so a message that cannot be
// decoded waits in its key's line too. For a delivery of a strict route
// it reads its key's row (one indexed read):
//
//   - a key that is not held runs;
//   - the message a release sent out for its run runs, and once it has
//     committed (or was a duplicate) the next parked message goes out, or
//     the hold ends;
//   - a replay of the held head from the DLQ runs, before the messages
//     parked behind it, and once it has committed the key is released;
//   - the held head itself again (redelivered after a crash before its
//     ack) is acked as a duplicate: its copy heads the line already;
//   - any other delivery of a held key is parked at the end of the key's
//     line and acked as a duplicate (source parked).
//
// A failure to read or park is a retryable error (reason "hold").
func (s *Store) Guard(namespaces map[string]bool, log *slog.Logger) inboxtype.Middleware {
	return func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
		return func(ctx context.Context, d *inboxtype.Delivery) error {
			if !namespaces[d.Namespace] || d.Raw == nil {
				return next(ctx, d)
			}
			key := d.Raw.RoutingKey
			st, ok, err := s.get(ctx, s.db, d.Namespace, key, false)
			if err != nil {
				return retry.WithReason("hold", retry.Retryable(err))
			}
			if !ok {
				return next(ctx, d)
			}
			seq := int64(inboxtype.HeaderInt(d.Headers, HeaderSeq))
			idemKey, _ := d.Headers[inboxtype.HeaderIdempotencyKey].(string)
			var after func(context.Context) error
			replay := inboxtype.HeaderInt(d.Headers, inboxtype.HeaderReplayCount) > 0
			switch {
			case st.state == StateHeld && seq == 0 && !replay && st.isHead(d.MessageID, idemKey):
				// The head itself again (redelivered after a crash before
				// its ack, or a resend): its copy heads the line already.
				return retry.Duplicate(retry.SourceParked, fmt.Errorf("held: the head of held ordering key %q waits in its line already", key))
			case st.state == StateReleasing && seq != 0 && seq == st.releasedSeq:
				after = func(ctx context.Context) error { return s.advance(ctx, d.Namespace, key, seq) }
			case st.state == StateHeld && st.headParked && seq == 0 && replay && st.isHead(d.MessageID, idemKey):
				after = func(ctx context.Context) error { return s.headRan(ctx, d.Namespace, key, d.MessageID, idemKey) }
			}
			if after != nil {
				err := next(ctx, d)
				if err == nil || errors.Is(err, retry.ErrDuplicate) {
					if aerr := after(ctx); aerr != nil {
						// The effect is in; the run again is a duplicate
						// and moves the key on.
						return retry.WithReason("hold", retry.Retryable(aerr))
					}
				}
				return err
			}
			pub := envelope.Copy(d.Raw, func(h amqp.Table) { delete(h, HeaderSeq) })
			parked, err := s.park(ctx, d.Namespace, key, &pub)
			if err != nil {
				return retry.WithReason("hold", retry.Retryable(err))
			}
			if !parked { // released in the meantime
				return next(ctx, d)
			}
			d.Transition(inboxtype.StatusParked, nil)
			log.LogAttrs(ctx, slog.LevelInfo, "ordered key held: delivery parked behind its head",
				slog.String("queue", d.Queue), slog.String("namespace", d.Namespace), slog.String("ordering_key", key),
				slog.String("message_id", d.MessageID))
			return retry.Duplicate(retry.SourceParked, fmt.Errorf("held: ordering key %q is held, the delivery waits behind its head", key))
		}
	}
}

// OnDeadLetter returns the dead-letter hook of a strict ordered route: it
// holds the dead letter's ordering key ([Store.Hold]) before the original
// is acked, and logs it.
func (s *Store) OnDeadLetter(namespace, queue, exchange string, log *slog.Logger) func(context.Context, consumer.DeadLetter) error {
	return func(ctx context.Context, dl consumer.DeadLetter) error {
		d := dl.Delivery
		key := dl.OrderingKey()
		if key == "" && d.Raw != nil {
			key = d.Raw.RoutingKey
		}
		idemKey, _ := dl.Headers[inboxtype.HeaderIdempotencyKey].(string)
		cp := dl.Replay()
		errText := inboxtype.DeadLetterReason(dl.Headers)
		h := DeadLetter{
			Namespace: namespace, Queue: queue, Exchange: exchange, Key: key,
			MessageID: d.MessageID, IdempotencyKey: idemKey, Seq: int64(inboxtype.HeaderInt(d.Headers, HeaderSeq)),
			Reason: dl.Decision.Reason, Error: errText, Copy: &cp,
		}
		if err := s.Hold(ctx, h); err != nil {
			return err
		}
		log.LogAttrs(ctx, slog.LevelWarn, "ordered key held after a dead letter: its later messages wait for an operator (inboxctl ordered)",
			slog.String("queue", queue), slog.String("namespace", namespace), slog.String("ordering_key", key),
			slog.String("message_id", d.MessageID), slog.String("key", idemKey), slog.String("reason", dl.Decision.Reason),
			slog.String("error", errText))
		return nil
	}
}
