package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/envelope"
)

// headerReplayRefused marks a dead letter that [ReplayDLQ] selected but
// refused to replay because it had been replayed MaxReplays times already.
const headerReplayRefused = "x-replay-refused"

// ReplayOpts select which dead letters [ReplayDLQ] moves back. A nil
// *ReplayOpts replays every message (up to MaxReplays each).
type ReplayOpts struct {
	// Limit is the most messages to replay. Defaults to 0: no limit.
	Limit int
	// Reason selects messages whose [inboxtype.DeadLetterReason] starts with it: the
	// reason inboxmq gave (such as "exhausted" or "decode") or the broker's
	// (such as "expired" or "delivery_limit"). Defaults to "": any reason.
	Reason string
	// Key selects the message with this x-idempotency-key. Defaults to "":
	// any key.
	Key string
	// MessageIDs selects the messages whose message id is one of these
	// (an operator's selection). Defaults to nil: any message id.
	MessageIDs []string
	// MaxReplays bounds how often one message may be replayed; a selected
	// message at the bound stays in the DLQ with headerReplayRefused set.
	// Defaults to 3; -1 means no bound.
	MaxReplays int
	// DeadLetterQueue is the DLQ to read. Defaults to "<queue>.dlq".
	DeadLetterQueue string
	// PublishTimeout bounds each publisher confirm. Defaults to 10s.
	PublishTimeout time.Duration
	// Exchange is the exchange of an ordered route (OrderedOpts.Exchange):
	// a dead letter that carries headerOrderingKey is replayed through it,
	// with its ordering key as routing key, so it lands in its key's
	// shard. Defaults to the queue name (OrderedOpts' default).
	Exchange string
}

// ReplayResult counts what [ReplayDLQ] did.
type ReplayResult struct {
	// Scanned is the number of dead letters looked at.
	Scanned int
	// Replayed is the number moved back to the work queue.
	Replayed int
	// Kept is the number not selected, left in the DLQ.
	Kept int
	// Refused is the number selected but left in the DLQ because they had
	// reached MaxReplays.
	Refused int
}

// ReplayDLQ moves dead letters of queue back to queue, whether inboxmq or
// the broker dead-lettered them. It looks at most at the messages that were
// in the DLQ when it started (so it terminates while new dead letters
// arrive). A dead letter that came from another work queue
// ([inboxtype.DeadLetterOrigin]) is never selected: it stays for that queue's replay.
// A selected message is published to the work queue with its body (and so
// its idempotency key) unchanged, x-attempt reset to 1 and x-replay-count
// incremented; the failure headers and the broker's death headers are
// dropped, and so is any per-message expiration, so a message that expired
// does not expire again. Every other message is re-published to the DLQ,
// so it stays there. A dead letter of an ordered route ([headerOrderingKey])
// goes back through the route's exchange (ReplayOpts.Exchange) with its
// ordering key, to its key's shard, after the key's later messages. Each publish is confirmed before the original is acked; on any
// error the unsettled message stays in the DLQ. Because a replay goes
// through the same inbox, replaying a message whose effect was already
// committed is acked as a duplicate.
func ReplayDLQ(ctx context.Context, conn *amqp.Connection, queue string, opts *ReplayOpts) (ReplayResult, error) {
	var res ReplayResult
	var o ReplayOpts
	if opts != nil {
		o = *opts
	}
	if o.DeadLetterQueue == "" {
		o.DeadLetterQueue = inboxtype.DeadLetterQueue(queue)
	}
	if o.MaxReplays == 0 {
		o.MaxReplays = 3
	}
	if o.PublishTimeout <= 0 {
		o.PublishTimeout = 10 * time.Second
	}
	if o.Exchange != "" && !ValidName(o.Exchange) {
		return res, fmt.Errorf("consumer: replay: invalid exchange name %q", o.Exchange)
	}
	if !ValidName(queue) || !ValidName(o.DeadLetterQueue) {
		return res, fmt.Errorf("consumer: replay: invalid queue name %q or %q", queue, o.DeadLetterQueue)
	}
	if conn == nil {
		return res, errors.New("consumer: replay: nil connection")
	}
	ch, err := conn.Channel()
	if err != nil {
		return res, fmt.Errorf("consumer: replay: open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(o.DeadLetterQueue, true, false, false, false, nil)
	if err != nil {
		return res, fmt.Errorf("consumer: replay: inspect %q: %w", o.DeadLetterQueue, err)
	}
	pub, err := newPublisher(conn, o.PublishTimeout, 1, slog.New(slog.DiscardHandler))
	if err != nil {
		return res, fmt.Errorf("consumer: replay: %w", err)
	}
	defer pub.close()
	for range q.Messages {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("consumer: replay: %w", err)
		}
		m, ok, err := ch.Get(o.DeadLetterQueue, false)
		if err != nil {
			return res, fmt.Errorf("consumer: replay: get from %q: %w", o.DeadLetterQueue, err)
		}
		if !ok {
			break
		}
		res.Scanned++
		selected := (o.Limit <= 0 || res.Replayed < o.Limit) && replayMatches(queue, m.MessageId, m.Headers, &o)
		replays := inboxtype.HeaderInt(m.Headers, inboxtype.HeaderReplayCount)
		exchange, target := "", o.DeadLetterQueue
		var edit func(amqp.Table) // nil: kept as it is
		replayed := false
		switch {
		case selected && o.MaxReplays > 0 && replays >= o.MaxReplays:
			edit = func(h amqp.Table) { h[headerReplayRefused] = true }
		case selected:
			target, replayed = queue, true
			edit = func(h amqp.Table) { setReplayHeaders(h, replays) }
			if key, ok := m.Headers[headerOrderingKey].(string); ok && key != "" {
				exchange, target = cmp.Or(o.Exchange, queue), key // an ordered route's shard
			}
		}
		if err := pub.publishTo(ctx, exchange, target, envelope.Copy(&m, edit)); err != nil {
			_ = m.Nack(false, true)
			return res, fmt.Errorf("consumer: replay: %w", err)
		}
		if err := m.Ack(false); err != nil {
			return res, fmt.Errorf("consumer: replay: ack: %w", err)
		}
		switch {
		case !selected:
			res.Kept++
		case replayed:
			res.Replayed++
		default:
			res.Refused++
		}
	}
	return res, nil
}

func replayMatches(queue, messageID string, h amqp.Table, o *ReplayOpts) bool {
	if origin := inboxtype.DeadLetterOrigin(h); origin != "" && origin != queue {
		return false
	}
	if o.Key != "" {
		if k, _ := h[inboxtype.HeaderIdempotencyKey].(string); k != o.Key {
			return false
		}
	}
	if o.MessageIDs != nil && !slices.Contains(o.MessageIDs, messageID) {
		return false
	}
	return strings.HasPrefix(inboxtype.DeadLetterReason(h), o.Reason)
}

// setReplayHeaders resets the attempt on h, a copy of a dead letter's
// headers, counts the replay and drops the failure and broker headers.
func setReplayHeaders(h amqp.Table, replays int) {
	for _, k := range []string{inboxtype.HeaderError, inboxtype.HeaderLastFailedAt, inboxtype.HeaderDeliveryCount, headerReplayRefused, "x-death", "x-first-death-exchange", "x-first-death-queue", "x-first-death-reason"} {
		delete(h, k)
	}
	h[inboxtype.HeaderAttempt] = int64(1)
	h[inboxtype.HeaderReplayCount] = int64(replays) + 1
}

func cloneTable(h amqp.Table) amqp.Table {
	out := make(amqp.Table, len(h)+2)
	for k, v := range h {
		out[k] = v
	}
	return out
}
