package inboxtype

import (
	"encoding/json"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Status is a step in the life of one delivery, as reported to
// [Observer.OnTransition] (and so written as one structured log line).
type Status string

// Status transitions of a delivery.
//
// StatusReceived is reported once per delivery, after its payload was
// decoded, so it carries the idempotency key; a delivery that could not be
// decoded (or whose middleware failed before decoding) is reported
// received, without a key, when its handler chain returns. Router-wide
// middleware runs before it.
//
// The settlement statuses (completed, duplicate, retry, failed,
// dead_lettered, requeued) are reported once per delivery, when the
// consumer has settled it, just before [Observer.OnOutcome];
// [Outcome.Status] names the same one.
const (
	StatusReceived   Status = "received"
	StatusLocked     Status = "locked"
	StatusProcessing Status = "processing"
	StatusCompleted  Status = "completed"
	StatusDuplicate  Status = "duplicate"
	// StatusRetry: a broker retry. A copy with the next attempt number was
	// published to a delay tier (Outcome.Delay) and the original acked.
	StatusRetry Status = "retry"
	// StatusRetryInProcess: an in-process retry. The handler runs again in
	// this worker after a short pause, with the same attempt number; it is
	// reported through [Observer.OnInProcessRetry], never as a transition.
	StatusRetryInProcess Status = "retry_in_process"
	StatusFailed         Status = "failed"
	StatusDeadLettered   Status = "dead_lettered"
	StatusRequeued       Status = "requeued"
	// StatusLockFailed: the Redis lock is held by another worker (the
	// delivery is retried later). StatusLockExpired: the lock or lease was
	// lost before completion (the handler's context is cancelled).
	StatusLockFailed  Status = "lock_failed"
	StatusLockExpired Status = "lock_expired"
	// StatusParked: the key is blocked at ingress; a copy of the delivery
	// was parked in "<queue>.parked" until an operator unblocks it.
	StatusParked Status = "parked"
)

// Delivery is one AMQP delivery on its way through the middleware chain. It
// is untyped: middleware sees bytes and headers, never the decoded payload's
// type. The consumer owns it; middleware may read every field and set the
// annotation fields (Key, Lock*, InboxFence, TraceID, CopyHeaders) but must not ack
// or nack Raw.
type Delivery struct {
	// Queue is the queue the delivery came from.
	Queue string
	// Namespace is the inbox namespace of the handler (the route's
	// RouteOpts.Namespace, which defaults to the queue name): idempotency
	// keys are unique per namespace.
	Namespace string
	// WorkerID identifies this worker process (Config.Name).
	WorkerID string
	// MessageID is the broker message id (may be empty; never used as the
	// idempotency key).
	MessageID string
	// Body is the raw payload.
	Body []byte
	// Headers are the AMQP headers (read-only by convention).
	Headers amqp.Table
	// Attempt is the 1-based attempt number (HeaderAttempt, else 1).
	Attempt int
	// Redelivered is the broker's redelivered flag: a previous delivery of
	// this message was not acked (crash, connection loss, requeue).
	Redelivered bool
	// DeliveryCount is the quorum queue's x-delivery-count (0 on classic
	// queues and on first delivery).
	DeliveryCount int
	// ReceivedAt is when the consumer received the delivery.
	ReceivedAt time.Time

	// Key is the idempotency key from the payload's business identity. It is
	// set after decoding, so it is empty in router-wide middleware until the
	// inner chain runs, and stays empty for a payload that could not be
	// decoded.
	Key string
	// Value is the decoded payload (a *T), set after decoding.
	Value any
	// Fingerprint tells "the same job again" from "another job reusing the
	// key": the payload's own [Fingerprinter] result, else the SHA-256 of
	// Body. It is set after decoding, with Key; the inbox records it and
	// the completed-cache compares it.
	Fingerprint []byte

	// LockKey, LockResult and LockFence are set by the Redis lock
	// middleware: the key it locked, how the attempt went (acquired, held,
	// degraded) and the lock's fencing token (0 without a lock). They are
	// annotations for logs and traces.
	LockKey    string
	LockResult string
	LockFence  int64
	// InboxFence is the fence of the inbox row's claim, set by the inbox
	// before the handler runs (0 before that, and without an inbox): it
	// grows by one each time the key is taken up.
	InboxFence int64
	// Result is the job's result as JSON: set by the handler through
	// [Message.SetResult] on the delivery that did the work (the inbox
	// stores it with the effect), and by the inbox on a duplicate of a
	// completed key (the result stored by the first delivery). Once the
	// inbox has ruled on the delivery it holds the bytes stored on the
	// key's row, byte for byte the same for the first delivery and every
	// duplicate. A reply to a request (reply_to) carries it. Nil when
	// there is none.
	Result json.RawMessage

	// TraceID is the trace id (32 lowercase hex digits) of the delivery's
	// span when it is sampled, set by the worker's tracing; the metrics put
	// it on the latency histograms' exemplars. Empty otherwise.
	TraceID string

	// CopyHeaders are added to the headers of the retry or dead-letter copy
	// the consumer publishes when this run of the chain fails, over the
	// delivery's own headers; the consumer's failure headers (attempt,
	// x-error, failure times, original queue) always win. The worker's
	// tracing puts the failed attempt's trace context there. Nil adds
	// nothing.
	CopyHeaders amqp.Table

	// Raw is the underlying delivery. Never ack, nack or reject it: only the
	// consumer settles deliveries.
	Raw *amqp.Delivery

	observers []Observer      // fixed at NewDelivery
	received  bool            // StatusReceived was reported
	onSettled []func(Outcome) // OnSettled hooks of the current run
	owned     bool            // a consumer settles d: Settle does nothing
}

// NewDelivery builds a Delivery from a raw AMQP delivery, reading the
// attempt and delivery-count headers; its transitions go to observers. The
// consumer uses it; tests and tools may too.
func NewDelivery(queue, namespace, workerID string, raw *amqp.Delivery, observers ...Observer) *Delivery {
	d := &Delivery{
		Queue:       queue,
		Namespace:   namespace,
		WorkerID:    workerID,
		MessageID:   raw.MessageId,
		Body:        raw.Body,
		Headers:     raw.Headers,
		Attempt:     max(HeaderInt(raw.Headers, HeaderAttempt), 1),
		Redelivered: raw.Redelivered,
		ReceivedAt:  time.Now(),
		Raw:         raw,
		observers:   observers,
	}
	d.DeliveryCount = HeaderInt(raw.Headers, HeaderDeliveryCount)
	return d
}

// Transition reports a status transition to the observers given to
// [NewDelivery]. Layers call it as the delivery moves on: the lock
// middleware reports StatusLocked, the inbox StatusProcessing.
// StatusReceived is reported at most once per delivery: later calls with
// it do nothing, so the consumer may report it both once the key is known
// and, for a delivery that never got that far, when its handler chain
// returns.
func (d *Delivery) Transition(status Status, err error) {
	if status == StatusReceived {
		if d.received {
			return
		}
		d.received = true
	}
	for _, o := range d.observers {
		o.OnTransition(d, status, err)
	}
}

// OnSettled registers f to run once the consumer has acted on the result
// of the current run of the handler chain: when it has settled the
// delivery, with the [Outcome] its observers get, or, when it retries the
// delivery in process, just before the chain runs again, with an Outcome
// whose Action is [ActionRetriedInProcess]. Middleware uses it to report
// what became of a delivery (the decision, the action, a reason such as
// exhausted) rather than classifying the chain's error again:
// the worker's tracing ends its span there.
//
// Each f runs once, on the goroutine that settles the delivery, in reverse
// order of registration (the innermost middleware's first, as deferred
// calls unwind) and before the observers hear of the settlement
// ([Observer.OnTransition], [Observer.OnOutcome]). Like an Observer, f must
// be fast and must not panic. Register from the chain itself (the
// goroutine running it, or one it waits for).
//
// Under a consumer a registered hook runs whatever the chain does next:
// return, fail or panic (register before calling next to be sure of it).
// A delivery handled outside a consumer runs its hooks when whoever
// handles it calls [Delivery.Settle]; until then they do not run.
func (d *Delivery) OnSettled(f func(Outcome)) {
	if f != nil {
		d.onSettled = append(d.onSettled, f)
	}
}

// Settle runs the hooks registered with [Delivery.OnSettled] since the last
// settlement with o, as the consumer does when it settles a delivery. It
// is for code that runs a handler chain outside a consumer, such as a test
// or inboxtest: call it once the chain has returned, with the outcome the
// delivery had (retry.Classify of the chain's error, with the route's
// Rules), so that the middleware's spans end and its observations are
// made. On a delivery a consumer is handling it does nothing: the consumer
// settles those.
func (d *Delivery) Settle(o Outcome) {
	if !d.owned {
		d.runSettled(o)
	}
}

// Own is for the consumer: it marks d as settled by its caller, so that
// [Delivery.Settle] does nothing on it from then on, and returns the
// function with which the caller runs the [Delivery.OnSettled] hooks of
// the current run when it has acted on that run's result. Code that runs
// a handler chain outside a consumer calls Settle instead.
func (d *Delivery) Own() (settled func(Outcome)) {
	d.owned = true
	return d.runSettled
}

// runSettled runs and forgets the hooks of the current run, last
// registered first.
func (d *Delivery) runSettled(o Outcome) {
	hooks := d.onSettled
	d.onSettled = nil
	for i := len(hooks) - 1; i >= 0; i-- {
		hooks[i](o)
	}
}

// SinceDeferred reports how long ago d was last deferred for reason: the
// time since its HeaderLastFailedAt, when its HeaderError says that its
// last retry had that reason ("<reason>: …"). It is 0 when d's last retry
// had another reason, d was never retried, or the headers do not parse.
// Deferrals that grow while a key stays held (the Redis lock's, a live
// claim's) start from it; the headers come from the message, so callers
// bound what they make of it.
func (d *Delivery) SinceDeferred(reason string, now time.Time) time.Duration {
	text, ok := d.Headers[HeaderError].(string)
	if !ok || !strings.HasPrefix(text, reason+":") {
		return 0
	}
	last, ok := d.Headers[HeaderLastFailedAt].(string)
	if !ok {
		return 0
	}
	at, err := time.Parse(time.RFC3339Nano, last)
	if err != nil || !now.After(at) {
		return 0
	}
	return now.Sub(at)
}
