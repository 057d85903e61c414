package inboxmq

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/outbox"
	"github.com/inboxmq/inboxmq/retry"
)

// FaultOpts makes a route publish a fault event for every message that
// reaches its DLQ, through the outbox: the handler's dead letters and
// those the broker dead-lettered (expired, over a quorum queue's delivery
// limit), which the worker files into the DLQ itself. The event's row is
// written once the dead-letter copy is confirmed in the DLQ and before the
// original is acked, so the event goes out exactly when the dead-letter
// settlement happened (see docs/results.md for the crash windows); the
// outbox relay publishes it.
type FaultOpts struct {
	// Exchange receives the fault events; list it in Config.Exchanges so
	// that Start declares it. Required.
	Exchange string
	// RoutingKey is the events' routing key. Defaults to "<queue>.fault".
	RoutingKey string
	// Body includes the original's body in the event (FaultEvent.Body, or
	// BodyBase64 when it is not JSON), up to MaxBody bytes. Defaults to
	// false: no body.
	Body bool
	// MaxBody bounds the body included: a longer one is left out and
	// FaultEvent.BodyOmitted set. Defaults to 16 KiB.
	MaxBody int
}

// FaultEvent is the JSON body of a fault event (FaultOpts). The event's
// headers carry the original's trace context and the failed attempt's
// (x-failed-traceparent), so a consumer traced as an inboxmq.Worker traces
// continues the trace and links to the failure. It is keyed
// (inboxtype.Keyer), so a worker of inboxmq can consume fault events
// with it as payload: a repeated event is a duplicate there.
type FaultEvent struct {
	// ID identifies the fault: the same for every dead-lettering of one
	// delivery of the message, another after each replay from the DLQ.
	// It is the event's x-idempotency-key, and its message id derives
	// from it.
	ID string `json:"id"`
	// Queue is the work queue the message was dead-lettered from, and
	// Namespace the route's inbox namespace.
	Queue     string `json:"queue"`
	Namespace string `json:"namespace"`
	// Key is the message's idempotency key ("" if its payload could not
	// be decoded), MessageID its broker message id.
	Key       string `json:"key,omitempty"`
	MessageID string `json:"message_id,omitempty"`
	// Reason is the dead-letter reason (exhausted, a permanent error's
	// reason, key_conflict, decode…), Error the copy's x-error text.
	Reason string `json:"reason"`
	Error  string `json:"error"`
	// Attempts is the broker attempt it was dead-lettered on (x-attempt).
	Attempts int `json:"attempts"`
	// FirstFailedAt and LastFailedAt are the copy's failure times
	// (RFC 3339).
	FirstFailedAt string `json:"first_failed_at,omitempty"`
	LastFailedAt  string `json:"last_failed_at,omitempty"`
	// ReplayCount is how often the message had been replayed from the DLQ
	// before: each replay that fails again publishes a new event.
	ReplayCount int `json:"replay_count"`
	// Body is the original's body when FaultOpts.Body is set and it is
	// JSON; BodyBase64 when it is not. BodyOmitted reports a body left out
	// for its size.
	Body        json.RawMessage `json:"body,omitempty"`
	BodyBase64  []byte          `json:"body_base64,omitempty"`
	BodyOmitted bool            `json:"body_omitted,omitempty"`
}

// IdempotencyKey implements inboxtype.Keyer: the fault's ID.
func (e FaultEvent) IdempotencyKey() string { return e.ID }

const defaultMaxFaultBody = 16 << 10

// faultHook returns the route's dead-letter hook that enqueues its fault
// event, or nil without FaultOpts.
func (w *Worker) faultHook(rt *route) (func(context.Context, consumer.DeadLetter) error, error) {
	o := rt.opts.Faults
	if o == nil {
		return nil, nil //nolint:nilnil // no fault events: no hook
	}
	if o.Exchange == "" {
		return nil, errors.New("fault events need an exchange (RouteOpts.Faults.Exchange)")
	}
	opts := *o
	if opts.RoutingKey == "" {
		opts.RoutingKey = rt.queue + ".fault"
	}
	if opts.MaxBody <= 0 {
		opts.MaxBody = defaultMaxFaultBody
	}
	return func(ctx context.Context, dl consumer.DeadLetter) error {
		msg, err := faultMessage(rt.queue, &opts, dl)
		if err != nil {
			return err
		}
		return pgx.BeginFunc(ctx, w.s.DB, func(tx pgx.Tx) error {
			return outbox.Enqueue(ctx, tx, msg)
		})
	}, nil
}

// faultMessage builds the outbox message of dl's fault event. Its
// idempotency key, and so its message id, is the same for every
// dead-lettering of one delivery (a redelivery after a crash re-derives
// it, and the outbox and the receiver's inbox absorb the repeat); a
// replay from the DLQ that fails again gets a new one.
func faultMessage(queue string, o *FaultOpts, dl consumer.DeadLetter) (outbox.Message, error) {
	d, h := dl.Delivery, dl.Headers
	ev := FaultEvent{
		Queue: queue, Namespace: d.Namespace, Key: d.Key, MessageID: d.MessageID,
		Reason: cmp.Or(dl.Decision.Reason, retry.ReasonError), Error: headerString(h, inboxtype.HeaderError),
		Attempts:      max(inboxtype.HeaderInt(h, inboxtype.HeaderAttempt), d.Attempt),
		FirstFailedAt: headerString(h, inboxtype.HeaderFirstFailedAt),
		LastFailedAt:  headerString(h, inboxtype.HeaderLastFailedAt),
		ReplayCount:   inboxtype.HeaderInt(d.Headers, inboxtype.HeaderReplayCount),
	}
	identity := d.Key
	switch {
	case identity != "":
	case d.MessageID != "":
		identity = "message:" + d.MessageID
	default:
		sum := sha256.Sum256(d.Body)
		identity = "body:" + hex.EncodeToString(sum[:])
	}
	// The namespace's length keeps the parts apart (both may hold ':').
	ev.ID = "fault:" + strconv.Itoa(len(d.Namespace)) + ":" + d.Namespace + ":" + identity + ":" + strconv.Itoa(ev.ReplayCount)
	if o.Body {
		switch {
		case len(d.Body) > o.MaxBody:
			ev.BodyOmitted = true
		case json.Valid(d.Body):
			ev.Body = d.Body
		default:
			ev.BodyBase64 = d.Body
		}
	}
	body, err := json.Marshal(ev)
	if err != nil {
		return outbox.Message{}, fmt.Errorf("inboxmq: encode fault event: %w", err)
	}
	// The trace goes on: the original's context, and the failed
	// attempt's (which a worker's consumer span links to) from the copy.
	headers := amqp.Table{}
	for _, k := range []string{"traceparent", "tracestate", inboxtype.HeaderFailedTraceparent, inboxtype.HeaderFailedTracestate} {
		if v, ok := h[k].(string); ok {
			headers[k] = v
		} else if v, ok := d.Headers[k].(string); ok {
			headers[k] = v
		}
	}
	return outbox.Message{
		Exchange:       o.Exchange,
		RoutingKey:     o.RoutingKey,
		IdempotencyKey: ev.ID,
		ContentType:    "application/json",
		Headers:        headers,
		Body:           body,
	}, nil
}

func headerString(h amqp.Table, name string) string {
	s, _ := h[name].(string)
	return s
}
