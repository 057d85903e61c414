package consumer

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// QueueType is the RabbitMQ queue type of a work queue.
type QueueType string

const (
	// Classic is a classic durable queue. Crash loops are bounded by the
	// inbox's delivery counter.
	Classic QueueType = "classic"
	// Quorum is a replicated quorum queue (the choice for clusters). Crash
	// loops are bounded by the broker's delivery limit, which dead-letters to
	// the DLQ.
	Quorum QueueType = "quorum"
)

// DefaultRetryTiers are the broker delay tiers used when QueueOpts.RetryTiers
// is nil: one wait queue per tier, so a short delay never waits behind a long
// one.
var DefaultRetryTiers = []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 10 * time.Minute}

// QueueOpts describe a handler's queue topology and its concurrency. The
// zero value is usable.
type QueueOpts struct {
	// Type is the queue type. Defaults to Classic.
	Type QueueType
	// Concurrency is the number of deliveries processed at once (a fixed pool
	// of workers). Defaults to 8.
	Concurrency int
	// Prefetch is the channel's QoS prefetch count. Defaults to
	// 2 × Concurrency; it is raised to Concurrency if set lower.
	Prefetch int
	// DeliveryLimit bounds deliveries of one message on a quorum queue; past
	// it the broker dead-letters the message to the DLQ (never drops it).
	// Defaults to 20. Ignored on classic queues.
	DeliveryLimit int
	// RetryTiers are the broker delay tiers, ascending. Defaults to
	// DefaultRetryTiers. A retry's delay is rounded up to the nearest tier.
	RetryTiers []time.Duration
	// DeadLetterQueue names the DLQ. Defaults to "<queue>.dlq".
	DeadLetterQueue string
	// Arguments are extra x-arguments for the work queue declaration.
	Arguments map[string]any
	// NoDeclare skips declaring the topology (it must already exist).
	NoDeclare bool
}

// HandlerOpts are per-handler settings. A nil *HandlerOpts means defaults.
type HandlerOpts struct {
	// Namespace is the inbox namespace of this handler: the idempotency key
	// is unique per (namespace, key), and the inbox stores the namespace in
	// its consumer column. Defaults to the queue name.
	Namespace string
	// Codec decodes payloads. Defaults to JSON.
	Codec Codec
	// Middleware runs inside the router-wide middleware, after decoding, so
	// it sees Delivery.Key and Delivery.Value (the completed-cache and the
	// Redis lock belong here). Outermost first.
	Middleware []inboxtype.Middleware
	// Rules are classification rules tried before retry's built-in taxonomy.
	Rules []retry.Rule
	// Policy bounds and spaces broker-side retries. Defaults to
	// retry.DefaultPolicy.
	Policy retry.Policy
	// InProcess is the short in-process retry for blips. Defaults to the zero
	// retry.InProcess (2 quick tries).
	InProcess retry.InProcess
	// Queue is the queue's topology and concurrency.
	Queue QueueOpts
	// Reply, when non-nil, answers requests: deliveries with reply_to
	// get a reply carrying the job's result (see ReplyOpts). Defaults to
	// nil: no replies.
	Reply *ReplyOpts
	// OnDeadLetter, when non-nil, runs once a delivery's dead-letter copy
	// is confirmed in the DLQ and before the original is acked, with
	// what was dead-lettered: what it does is done exactly when the
	// dead-letter settlement happened. If it returns an error the
	// original is requeued instead of acked; its redelivery is
	// dead-lettered again (a second copy in the DLQ, which a replay
	// absorbs as a duplicate) and OnDeadLetter runs again, so it must be
	// idempotent. It runs for every message that reaches the DLQ: the
	// handler's dead letters and those the broker dead-lettered (expired,
	// over the delivery limit), which the consumer files into the DLQ
	// with reason "broker_" and the broker's x-death reason. If the
	// connection to the broker fails while it runs, the consumer
	// reconnects without waiting for it past Config.PublishTimeout; the
	// message is then filed, and the hook run, again. Defaults to nil.
	OnDeadLetter func(ctx context.Context, dl DeadLetter) error
	// Ordered, when non-nil, consumes the route through shard queues
	// with per-key order across workers (see OrderedOpts); its retries
	// then run in process, never through the delay tiers. Defaults to
	// nil: one work queue, no order between deliveries.
	Ordered *OrderedOpts
}

func (o *HandlerOpts) withDefaults(queue string) HandlerOpts {
	var out HandlerOpts
	if o != nil {
		out = *o
	}
	if out.Namespace == "" {
		out.Namespace = queue
	}
	if out.Codec == nil {
		out.Codec = JSON
	}
	if out.Policy == nil {
		out.Policy = retry.DefaultPolicy
	}
	q := &out.Queue
	if q.Type == "" {
		q.Type = Classic
	}
	if q.Concurrency <= 0 {
		q.Concurrency = 8
	}
	if q.Prefetch <= 0 {
		q.Prefetch = 2 * q.Concurrency
	}
	q.Prefetch = max(q.Prefetch, q.Concurrency)
	if q.DeliveryLimit == 0 {
		q.DeliveryLimit = 20
	}
	if q.RetryTiers == nil {
		q.RetryTiers = DefaultRetryTiers
	}
	q.RetryTiers = slices.Clone(q.RetryTiers)
	slices.Sort(q.RetryTiers)
	if q.DeadLetterQueue == "" {
		q.DeadLetterQueue = inboxtype.DeadLetterQueue(queue)
	}
	out.Ordered = out.Ordered.withDefaults(queue)
	return out
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$`)

// ValidName reports whether s is acceptable as a queue name or inbox namespace:
// 1–200 characters of letters, digits and . _ : -, not starting with a
// punctuation mark. inboxmq validates every name it puts into AMQP or SQL.
func ValidName(s string) bool { return nameRE.MatchString(s) }

func (o HandlerOpts) validate(queue string) error {
	if !ValidName(queue) {
		return fmt.Errorf("consumer: invalid queue name %q", queue)
	}
	if !ValidName(o.Namespace) {
		return fmt.Errorf("consumer: invalid namespace %q", o.Namespace)
	}
	if !ValidName(o.Queue.DeadLetterQueue) {
		return fmt.Errorf("consumer: invalid dead-letter queue name %q", o.Queue.DeadLetterQueue)
	}
	switch o.Queue.Type {
	case Classic, Quorum:
	default:
		return fmt.Errorf("consumer: unknown queue type %q", o.Queue.Type)
	}
	if o.Queue.Type == Quorum && o.Queue.DeliveryLimit < 0 {
		return errors.New("consumer: a quorum queue needs a positive DeliveryLimit (a negative one would let poison messages loop)")
	}
	if len(o.Queue.RetryTiers) == 0 {
		return errors.New("consumer: RetryTiers must not be empty")
	}
	for _, t := range o.Queue.RetryTiers {
		if t < time.Millisecond {
			return fmt.Errorf("consumer: retry tier %s is below 1ms", t)
		}
	}
	return o.Ordered.validate(queue)
}

// Route is one registered handler with its options resolved.
type Route struct {
	// Queue is the work queue.
	Queue string
	// Opts are the handler's options with defaults applied.
	Opts HandlerOpts
	// Handler is the complete chain: router middleware, decoding, handler
	// middleware and the typed handler.
	Handler inboxtype.DeliveryHandler

	// keyOf decodes a delivery's payload only to set its Key, for the
	// dead letters the consumer files without running the handler.
	keyOf func(d *inboxtype.Delivery)
	// ctl is the queue's pause and concurrency, the router's.
	ctl *control
}

// Router maps queues to typed handlers and holds the router-wide
// middleware. Register handlers and call Use before the consumer starts.
type Router struct {
	mu         sync.Mutex
	routes     map[string]*registration
	order      []string
	middleware []inboxtype.Middleware
}

type registration struct {
	queue string
	opts  HandlerOpts
	inner inboxtype.DeliveryHandler // decode + handler middleware + typed handler
	keyOf func(d *inboxtype.Delivery)
	ctl   *control
}

// NewRouter returns an empty router.
func NewRouter() *Router {
	return &Router{routes: make(map[string]*registration)}
}

// Use appends router-wide middleware, outermost first. It runs before the
// payload is decoded (recover, logging, metrics, tracing, timeouts).
func (r *Router) Use(mw ...inboxtype.Middleware) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.middleware = append(r.middleware, mw...)
}

// Routes returns the registered routes in registration order, each with its
// complete middleware chain.
func (r *Router) Routes() []Route {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Route, 0, len(r.order))
	outer := inboxtype.Chain(r.middleware...)
	for _, q := range r.order {
		reg := r.routes[q]
		out = append(out, Route{Queue: q, Opts: reg.opts, Handler: outer(reg.inner), keyOf: reg.keyOf, ctl: reg.ctl})
	}
	return out
}

// Register registers h for queue. It panics if the registration is invalid
// or the queue already has a handler (a start-up bug); see RegisterSafely.
func Register[T any](r *Router, queue string, h inboxtype.Handler[T], opts *HandlerOpts) {
	if err := RegisterSafely(r, queue, h, opts); err != nil {
		panic(err)
	}
}

// RegisterSafely is Register returning an error instead of panicking.
//
// Each delivery is decoded with the handler's Codec into a T; a decode
// failure (reason "decode"), a Validate error (when T implements
// [inboxtype.Validator]) or an idempotency key that [inboxtype.ValidKey] refuses (reason
// "invalid") is permanent: the delivery is dead-lettered with the reason
// and never requeued. T (or *T) should implement [inboxtype.Keyer]; handlers wrapped
// by the inbox require it. Before the handler middleware runs, the
// delivery's Key, Value and Fingerprint are set (see [inboxtype.Fingerprinter]).
func RegisterSafely[T any](r *Router, queue string, h inboxtype.Handler[T], opts *HandlerOpts) error {
	if r == nil {
		return errors.New("consumer: nil router")
	}
	if h == nil {
		return errors.New("consumer: nil handler")
	}
	o := opts.withDefaults(queue)
	if err := o.validate(queue); err != nil {
		return err
	}
	keyed := implements[T, inboxtype.Keyer]()
	inner := inboxtype.Chain(o.Middleware...)(func(ctx context.Context, d *inboxtype.Delivery) error {
		v, ok := d.Value.(*T)
		if !ok {
			return retry.Permanent(fmt.Errorf("consumer: payload of type %T, want %T", d.Value, v))
		}
		msg := &inboxtype.Message[T]{
			ID:          d.MessageID,
			Key:         d.Key,
			Namespace:   d.Namespace,
			Body:        *v,
			Headers:     d.Headers,
			Attempt:     d.Attempt,
			Redelivered: d.Redelivered,
			Delivery:    d,
		}
		return h.Handle(ctx, msg)
	})
	decode := func(ctx context.Context, d *inboxtype.Delivery) error {
		v := new(T)
		if err := o.Codec.Decode(d.Body, v); err != nil {
			return retry.Permanent(retry.WithReason(retry.ReasonDecode, fmt.Errorf("consumer: decode %s payload: %w", queue, err)))
		}
		if val, ok := any(v).(inboxtype.Validator); ok {
			if err := val.Validate(); err != nil {
				return retry.Permanent(retry.WithReason(retry.ReasonInvalid, fmt.Errorf("consumer: invalid %s payload: %w", queue, err)))
			}
		}
		if keyed {
			k, _ := any(v).(inboxtype.Keyer)
			d.Key = k.IdempotencyKey()
			if err := inboxtype.ValidKey(d.Key); err != nil {
				return retry.Permanent(retry.WithReason(retry.ReasonInvalid, fmt.Errorf("consumer: invalid %s payload: %w", queue, err)))
			}
		}
		d.Value = v
		d.Fingerprint = inboxtype.FingerprintOf(v, d.Body)
		d.Transition(inboxtype.StatusReceived, nil) // once the key is known
		return inner(ctx, d)
	}

	keyOf := func(d *inboxtype.Delivery) {
		v := new(T)
		if !keyed || o.Codec.Decode(d.Body, v) != nil {
			return
		}
		k, _ := any(v).(inboxtype.Keyer)
		if key := k.IdempotencyKey(); inboxtype.ValidKey(key) == nil {
			d.Key = key
		}
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.routes[queue]; dup {
		return fmt.Errorf("consumer: queue %q already has a handler", queue)
	}
	r.routes[queue] = &registration{queue: queue, opts: o, inner: decode, keyOf: keyOf, ctl: newControl(o.Queue.Concurrency)}
	r.order = append(r.order, queue)
	return nil
}

// implements reports whether *T implements I (which covers value receivers
// of T as well).
func implements[T, I any]() bool {
	return reflect.TypeFor[*T]().Implements(reflect.TypeFor[I]())
}
