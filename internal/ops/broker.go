package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
)

// ErrQueueNotFound reports a queue the broker does not have.
var ErrQueueNotFound = errors.New("ops: queue not found")

// DeadLetter is one message read from a dead-letter (or parked) queue.
type DeadLetter struct {
	MessageID     string
	Key           string
	Error         string // inboxtype.DeadLetterReason
	Attempt       int
	ReplayCount   int
	OriginalQueue string // inboxtype.DeadLetterOrigin
	FirstFailedAt string
	LastFailedAt  string
	// Bytes is the body's full length; Body holds at most the bodyLimit
	// asked of [PeekQueue].
	Bytes       int
	Body        []byte
	ContentType string
	Headers     amqp.Table
}

// Group is the reason class of the dead letter: the text of its reason
// before the first ": " ("exhausted", "decode", "expired (broker)").
func (d *DeadLetter) Group() string { return ReasonGroup(d.Error) }

// ReasonGroup returns the class of a dead-letter reason: its text before
// the first ": ", or "(no reason)" when it is empty.
func ReasonGroup(reason string) string {
	if reason == "" {
		return "(no reason)"
	}
	if i := strings.Index(reason, ": "); i > 0 {
		return reason[:i]
	}
	return reason
}

// GroupFilter returns the consumer.ReplayOpts.Reason prefix that selects
// exactly the dead letters of group (a group's reason prefix is followed by
// ": " or ends the reason).
func GroupFilter(group string, reasons []string) string {
	if group == "(no reason)" {
		return ""
	}
	for _, r := range reasons {
		if strings.HasPrefix(r, group+": ") {
			return group + ": "
		}
	}
	return group
}

// Peek is what [PeekQueue] read.
type Peek struct {
	// Queue is the queue read and Messages its depth when the read began.
	Queue    string
	Messages int
	// DeadLetters are the messages read, head first.
	DeadLetters []DeadLetter
}

func headerString(h amqp.Table, name string) string {
	if s, ok := h[name].(string); ok {
		return s
	}
	return ""
}

func isNotFound(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == amqp.NotFound
}

// PeekQueue reads up to limit messages (0: every message) of queue name
// without removing them: each is fetched unacknowledged and all are
// returned to the queue (requeued, head first) before PeekQueue returns,
// or by the broker when the channel closes on an error. Bodies are cut to
// bodyLimit bytes (0: whole). The returned messages are marked redelivered
// by the broker from then on; nothing else about them changes.
func PeekQueue(conn *amqp.Connection, name string, limit, bodyLimit int) (*Peek, error) {
	if !consumer.ValidName(name) {
		return nil, fmt.Errorf("ops: invalid queue name %q", name)
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("channel: %w", err)
	}
	// Closing the channel returns every unacked message to the queue.
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(name, false, false, false, false, nil)
	if err != nil {
		if isNotFound(err) {
			return nil, fmt.Errorf("%w: %s", ErrQueueNotFound, name)
		}
		return nil, fmt.Errorf("inspect %s: %w", name, err)
	}
	p := &Peek{Queue: name, Messages: q.Messages, DeadLetters: []DeadLetter{}}
	n := q.Messages
	if limit > 0 {
		n = min(n, limit)
	}
	for range n {
		d, ok, err := ch.Get(name, false)
		if err != nil {
			return nil, fmt.Errorf("get: %w", err)
		}
		if !ok {
			break
		}
		body := d.Body
		if bodyLimit > 0 && len(body) > bodyLimit {
			body = body[:bodyLimit]
		}
		p.DeadLetters = append(p.DeadLetters, DeadLetter{
			MessageID: d.MessageId, Key: headerString(d.Headers, inboxtype.HeaderIdempotencyKey),
			Error: inboxtype.DeadLetterReason(d.Headers), Attempt: inboxtype.HeaderInt(d.Headers, inboxtype.HeaderAttempt),
			ReplayCount: inboxtype.HeaderInt(d.Headers, inboxtype.HeaderReplayCount), OriginalQueue: inboxtype.DeadLetterOrigin(d.Headers),
			FirstFailedAt: headerString(d.Headers, inboxtype.HeaderFirstFailedAt), LastFailedAt: headerString(d.Headers, inboxtype.HeaderLastFailedAt),
			Bytes: len(d.Body), Body: body, ContentType: d.ContentType, Headers: d.Headers,
		})
	}
	if len(p.DeadLetters) > 0 {
		if err := ch.Nack(0, true, true); err != nil {
			return nil, fmt.Errorf("return messages to %s: %w", name, err)
		}
	}
	return p, nil
}

// PurgeQueue deletes every message of queue name and returns how many.
func PurgeQueue(conn *amqp.Connection, name string) (int, error) {
	if !consumer.ValidName(name) {
		return 0, fmt.Errorf("ops: invalid queue name %q", name)
	}
	ch, err := conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("channel: %w", err)
	}
	defer ch.Close()
	n, err := ch.QueuePurge(name, false)
	if isNotFound(err) {
		return 0, fmt.Errorf("%w: %s", ErrQueueNotFound, name)
	}
	if err != nil {
		return 0, fmt.Errorf("purge %s: %w", name, err)
	}
	return n, nil
}

// QueueDepth is a queue's depth and consumer count.
type QueueDepth struct {
	Name      string
	Exists    bool
	Messages  int
	Consumers int
}

// Depths reads the depth of each named queue (a passive declare each); a
// queue the broker does not have is reported with Exists false.
func Depths(conn *amqp.Connection, names []string) ([]QueueDepth, error) {
	out := make([]QueueDepth, 0, len(names))
	var ch *amqp.Channel
	defer func() {
		if ch != nil {
			_ = ch.Close()
		}
	}()
	for _, name := range names {
		if ch == nil {
			var err error
			if ch, err = conn.Channel(); err != nil {
				return out, fmt.Errorf("channel: %w", err)
			}
		}
		q, err := ch.QueueDeclarePassive(name, false, false, false, false, nil)
		switch {
		case isNotFound(err):
			ch = nil // the broker closed the channel
			out = append(out, QueueDepth{Name: name})
		case err != nil:
			return out, fmt.Errorf("inspect %s: %w", name, err)
		default:
			out = append(out, QueueDepth{Name: name, Exists: true, Messages: q.Messages, Consumers: q.Consumers})
		}
	}
	return out, nil
}

// UnblockResult is what [Unblock] did.
type UnblockResult struct {
	// Removed reports whether the block existed.
	Removed bool
	// Released is the number of parked messages moved back to the queue.
	Released int
}

// Unblock removes the block of pattern (a key, or a prefix) for namespace
// and then, when conn is not nil, releases the matching parked messages of
// queue to it (control.Release). The order matters: a message released
// while its key is still blocked would be parked again.
func Unblock(ctx context.Context, st *control.Store, conn *amqp.Connection, namespace, pattern string, prefix bool, queue string) (UnblockResult, error) {
	var res UnblockResult
	removed, err := st.Unblock(ctx, namespace, pattern, prefix)
	if err != nil {
		return res, err
	}
	res.Removed = removed
	if conn == nil {
		return res, nil
	}
	res.Released, err = control.Release(ctx, conn, queue, &control.ReleaseOpts{Key: pattern, Prefix: prefix})
	return res, err
}
