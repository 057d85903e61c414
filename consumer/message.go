package consumer

import (
	"crypto/sha256"
	"encoding/json"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Header names that inboxmq reads and writes on AMQP messages.
const (
	// HeaderAttempt carries the 1-based attempt number across broker-side
	// retries. A message without it is attempt 1.
	HeaderAttempt = "x-attempt"
	// HeaderError carries the reason a message was dead-lettered or retried:
	// "<reason>: <error text>", at most 1 KiB. A copy whose headers had to
	// be trimmed to fit the connection's frame ends it with "; original
	// headers trimmed: N dropped".
	HeaderError = "x-error"
	// HeaderFirstFailedAt and HeaderLastFailedAt carry RFC 3339 times. A
	// copy keeps an incoming first failure time only from one of its own
	// earlier copies (HeaderOriginalQueue names the same queue) and only if
	// it is a valid time not in the future; otherwise it is the time of
	// this failure.
	HeaderFirstFailedAt = "x-first-failed-at"
	HeaderLastFailedAt  = "x-last-failed-at"
	// HeaderOriginalQueue names the work queue a retried or dead-lettered
	// message came from.
	HeaderOriginalQueue = "x-original-queue"
	// HeaderIdempotencyKey carries the idempotency key on dead letters and
	// outbox messages, so operators can select by key.
	HeaderIdempotencyKey = "x-idempotency-key"
	// HeaderReplayCount counts how often a message was replayed from the DLQ.
	HeaderReplayCount = "x-replay-count"
	// HeaderDeliveryCount is set by quorum queues: how often the broker has
	// delivered (and got back) the message.
	HeaderDeliveryCount = "x-delivery-count"
)

// Status transitions of a delivery. Each one is reported to the observers
// (and so becomes one structured log line).
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
	StatusReceived   = "received"
	StatusLocked     = "locked"
	StatusProcessing = "processing"
	StatusCompleted  = "completed"
	StatusDuplicate  = "duplicate"
	// StatusRetry: a broker retry. A copy with the next attempt number was
	// published to a delay tier (Outcome.Delay) and the original acked.
	StatusRetry = "retry"
	// StatusRetryInProcess: an in-process retry. The handler runs again in
	// this worker after a short pause, with the same attempt number; it is
	// reported through [Observer.OnInProcessRetry], never as a transition.
	StatusRetryInProcess = "retry_in_process"
	StatusFailed         = "failed"
	StatusDeadLettered   = "dead_lettered"
	StatusRequeued       = "requeued"
	// StatusLockFailed: the Redis lock is held by another worker (the
	// delivery is retried later). StatusLockExpired: the lock or lease was
	// lost before completion (the handler's context is cancelled).
	StatusLockFailed  = "lock_failed"
	StatusLockExpired = "lock_expired"
	// StatusParked: the key is blocked at ingress; a copy of the delivery
	// was parked in "<queue>.parked" until an operator unblocks it.
	StatusParked = "parked"
)

// Delivery is one AMQP delivery on its way through the middleware chain. It
// is untyped: middleware sees bytes and headers, never the decoded payload's
// type. The consumer owns it; middleware may read every field and set the
// annotation fields (Key, Lock*, Fence) but must not ack or nack Raw.
type Delivery struct {
	// Queue is the queue the delivery came from.
	Queue string
	// Consumer is the inbox namespace of the handler (HandlerOpts.Consumer,
	// which defaults to the queue name).
	Consumer string
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

	// LockKey, LockResult and Fence are annotations set by the lock and
	// inbox layers for logs and traces.
	LockKey    string
	LockResult string
	Fence      int64

	// Raw is the underlying delivery. Never ack, nack or reject it: only the
	// consumer settles deliveries.
	Raw *amqp.Delivery

	observers []Observer      // fixed at NewDelivery
	received  bool            // StatusReceived was reported
	onSettled []func(Outcome) // OnSettled hooks of the current run
	owned     bool            // a consumer settles d: Settle does nothing
}

// NewDelivery builds a Delivery from a raw AMQP delivery, reading the
// attempt and delivery-count headers. The consumer uses it; tests and tools
// may too.
func NewDelivery(queue, consumerName, workerID string, raw *amqp.Delivery, observers ...Observer) *Delivery {
	d := &Delivery{
		Queue:       queue,
		Consumer:    consumerName,
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

// Transition reports a status transition (one of the Status constants) to
// the consumer's observers. Layers call it as the delivery moves on: the
// lock middleware reports StatusLocked, the inbox StatusProcessing.
func (d *Delivery) Transition(status string, err error) {
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
// middleware.Tracing ends its span there.
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
// delivery had (see [Decide]), so that the middleware's spans end and its
// observations are made. On a delivery a consumer is handling it does
// nothing: the consumer settles those.
func (d *Delivery) Settle(o Outcome) {
	if !d.owned {
		d.runSettled(o)
	}
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

// transitionReceived reports StatusReceived the first time it is called.
// The decode adapter calls it once the key is known; the consumer calls it
// when the handler chain returns, for a delivery that never got that far.
func (d *Delivery) transitionReceived() {
	if d.received {
		return
	}
	d.received = true
	d.Transition(StatusReceived, nil)
}

// HeaderInt reads an integer header of any AMQP integer type (or a decimal
// string); a missing or malformed header reads as 0.
func HeaderInt(h amqp.Table, name string) int {
	switch v := h[name].(type) {
	case int:
		return v
	case int8:
		return int(v)
	case int16:
		return int(v)
	case int32:
		return int(v)
	case int64:
		return int(v)
	case uint8:
		return int(v)
	case uint16:
		return int(v)
	case uint32:
		return int(v)
	case string:
		n, err := strconv.Atoi(v)
		if err != nil {
			return 0
		}
		return n
	default:
		return 0
	}
}

// Message is a decoded delivery handed to a typed [Handler].
type Message[T any] struct {
	// ID is the broker message id (informational only).
	ID string
	// Key is the idempotency key (from the payload's IdempotencyKey method).
	Key string
	// Consumer is the inbox namespace of the handler.
	Consumer string
	// Body is the decoded payload.
	Body T
	// Headers are the AMQP headers.
	Headers amqp.Table
	// Attempt is the 1-based attempt number.
	Attempt int
	// Redelivered is the broker's redelivered flag.
	Redelivered bool
	// Delivery is the untyped delivery this message was decoded from.
	Delivery *Delivery
}

// Fingerprint returns the message's fingerprint: Delivery.Fingerprint when
// set (Register sets it on every delivery it decodes), else computed as
// Register would, from Body and the delivery's raw body (the JSON encoding
// of Body when the message has no delivery). The inbox records this value.
func (m *Message[T]) Fingerprint() []byte {
	if d := m.Delivery; d != nil {
		if d.Fingerprint != nil {
			return d.Fingerprint
		}
		return fingerprint(&m.Body, d.Body)
	}
	if f := fingerprinter(&m.Body); f != nil {
		return f.Fingerprint()
	}
	raw, err := json.Marshal(m.Body)
	if err != nil {
		return nil
	}
	return fingerprint(&m.Body, raw)
}

// fingerprint is the one fingerprint function: v's own Fingerprint when T
// or *T implements [Fingerprinter], else the SHA-256 of raw.
func fingerprint[T any](v *T, raw []byte) []byte {
	if f := fingerprinter(v); f != nil {
		return f.Fingerprint()
	}
	sum := sha256.Sum256(raw)
	return sum[:]
}

// fingerprinter returns v as a Fingerprinter (through a value or pointer
// method), or nil.
func fingerprinter[T any](v *T) Fingerprinter {
	f, _ := any(v).(Fingerprinter)
	return f
}
