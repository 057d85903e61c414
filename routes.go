package inboxmq

import (
	"cmp"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/retry"
)

// Routes are the handlers of a [Worker], one per queue. Build them with
// [NewRoutes] and register with [HandleTx], [HandleBatch] or [HandleClaim]
// before passing them in Config.Routes. A registration error (a nil
// handler, a payload without an idempotency key, an invalid option) is
// kept and returned by [NewWorker], naming the queue. Routes may serve
// several workers; they are safe for concurrent registration.
type Routes struct {
	mu     sync.Mutex
	routes []*route
}

// NewRoutes returns an empty set of routes.
func NewRoutes() *Routes { return &Routes{} }

// RouteOpts are the settings of one route. A nil *RouteOpts means the
// defaults.
type RouteOpts struct {
	// Namespace is the inbox namespace: idempotency keys are unique per
	// (namespace, key), and inboxctl's controls name it. Defaults to the
	// queue name.
	Namespace string
	// Concurrency is the number of deliveries handled at once by each
	// worker. Defaults to 8; with GroupCommit, to enough handlers to fill
	// its batches ([inbox.GroupCommit.Concurrency]).
	Concurrency int
	// Queue is the route's queue topology. Defaults to nil: quorum queues
	// with a delivery limit of 20 and the default retry tiers.
	Queue *QueueOpts
	// Retry bounds and spaces the retries of a failed delivery through the
	// broker's delay queues; past its last attempt the delivery is
	// dead-lettered as exhausted. Defaults to retry.DefaultPolicy.
	Retry retry.Policy
	// InProcess retries a blip (an unclassified error, a dropped
	// connection) in process, quickly, before a broker retry spends an
	// attempt. Defaults to its zero value: 2 quick tries; Tries -1 turns
	// it off.
	InProcess retry.InProcess
	// Rules classify errors before retry's built-in taxonomy. Defaults to
	// none.
	Rules []retry.Rule
	// Middleware wraps the handler, outermost first, inside the worker's
	// own (blocked keys, completed-cache, breaker, lock, rate limit).
	// Defaults to none.
	Middleware []inboxtype.Middleware
	// GroupCommit lets deliveries handled at once share one transaction
	// and one commit (in claim mode, their completions); see
	// [inbox.GroupCommit] for what a handler may then assume. Leave
	// Concurrency at 0 with it. Defaults to nil: one transaction per
	// delivery.
	GroupCommit *inbox.GroupCommit
	// Claim holds claim mode's settings ([HandleClaim]): the lease, the
	// stored payload, the reconciler's effect check. Defaults to nil:
	// [inbox.ClaimOpts]'s defaults. A transactional route refuses it.
	Claim *inbox.ClaimOpts
	// Lock takes a Redis lock on each delivery's key before the handler
	// runs (with Config.Redis). The inbox alone keeps concurrent copies
	// apart in both modes; the lock only keeps them out of PostgreSQL,
	// which saves database connections under bursts of copies at the cost
	// of two Redis operations per delivery. Defaults to nil: no lock.
	Lock *LockOpts
	// Reply answers requests (RabbitMQ RPC): a delivery with reply_to that
	// completes, or is a duplicate of a completed key, gets a reply under
	// its own correlation_id carrying the result the handler stored with
	// inboxtype.Message.SetResult — the same bytes for every copy —
	// published after the commit and before the ack. Defaults to false.
	Reply bool
	// Faults publishes a fault event through the outbox for every message
	// that reaches the route's DLQ (see [FaultOpts]). Defaults to nil.
	Faults *FaultOpts
	// Ordered consumes the route through shard queues with per-key order
	// across workers (see [OrderedOpts]). Defaults to nil: one work queue,
	// no order between messages.
	Ordered *OrderedOpts
	// Fair shares the route's slots among tenants, so that one tenant's
	// burst does not hold another's messages back (see [FairOpts]).
	// Defaults to nil: one work queue, first come first served. It
	// excludes Ordered.
	Fair *FairOpts
	// Breaker pauses the route while the downstream its handler calls
	// keeps failing (see [BreakerOpts]). Defaults to nil: no breaker.
	Breaker *BreakerOpts
	// RateLimit bounds the route's calls to a downstream across every
	// worker (see [RateLimitOpts]). Defaults to nil: no limit.
	RateLimit *RateLimitOpts
	// Tenant names a delivery's tenant (from its headers or its key; ""
	// for none). When a run asks for a delay with retry.After (a
	// downstream's 429 with Retry-After), the worker defers the rest of
	// that tenant's deliveries until the delay ends, without running them
	// and without counting an attempt, while other tenants flow. Defaults
	// to nil: such a delay defers its own key alone.
	Tenant func(d *inboxtype.Delivery) string
	// AfterDead says what a new delivery of a key that was dead-lettered
	// does (see [ReusePolicy]): run again, be rejected to the DLQ, or be
	// attached to the stored outcome. A replay from the DLQ always runs.
	// Defaults to ReuseRun; the others cost one read of the key's row per
	// delivery.
	AfterDead ReusePolicy
}

// QueueType is the RabbitMQ type of a route's queues.
type QueueType string

// Queue types.
const (
	// Quorum queues are replicated across a cluster's nodes, count
	// deliveries (the delivery limit ends a crash loop) and dead-letter at
	// least once: RabbitMQ's choice for durable work.
	Quorum QueueType = "quorum"
	// Classic queues live on one node.
	Classic QueueType = "classic"
)

// QueueOpts describe a route's queue topology: the work queue, its
// dead-letter queue "<queue>.dlq", its dead queue "<queue>.dead" (what the
// broker dead-letters waits there for a worker to file it in the DLQ) and
// one delay queue per retry tier. A nil *QueueOpts means the defaults.
type QueueOpts struct {
	// Type is the type of every queue of the route. Defaults to Quorum. A
	// route whose queues exist with the other type keeps them, with a
	// warning (docs/operations.md, "Changing a queue's type").
	Type QueueType
	// Prefetch is the number of deliveries the broker sends ahead of the
	// handlers. Defaults to twice the route's concurrency.
	Prefetch int
	// DeliveryLimit bounds the deliveries of one message without a
	// settlement on a quorum queue (a worker crashing on it every time);
	// past it the broker dead-letters it. Keep it above the retry
	// policy's attempts. Defaults to 20.
	DeliveryLimit int
	// RetryTiers are the delays of the broker-side retry queues,
	// ascending; a retry waits in the first tier at least as long as its
	// delay. Defaults to 1s, 5s, 30s, 2m and 10m.
	RetryTiers []time.Duration
	// DeadLetterQueue names the DLQ. Defaults to "<queue>.dlq".
	DeadLetterQueue string
	// Arguments are extra x-arguments of the work queue (a TTL, a length
	// limit); those that decide whether a message may be dropped are
	// inboxmq's and refused. Defaults to none.
	Arguments map[string]any
	// NoDeclare uses the topology as it exists instead of declaring it.
	// Defaults to false.
	NoDeclare bool
}

// OrderedOpts spread a route over shard queues behind a consistent-hash
// exchange (the broker's rabbitmq_consistent_hash_exchange plugin): the
// messages of one ordering key — the routing key producers publish with
// to the exchange, such as an order's id — are handled one at a time, in
// the order the broker received them, across every worker, while other
// keys run in parallel; workers that join or leave share the shards out.
// A failed message is retried in process and holds its key's later
// messages back until it succeeds or is dead-lettered, or, with Strict,
// until an operator releases the key (docs/ordering.md).
type OrderedOpts struct {
	// Shards is the number of shard queues "<queue>.shard.<i>", hence the
	// most workers that consume the route at once. It must not change
	// while the route has messages. Defaults to 8.
	Shards int
	// Exchange is the exchange producers publish to. Defaults to the
	// queue name.
	Exchange string
	// RebalanceInterval is how often a worker gives up the shards it holds
	// beyond its fair share. Defaults to 5s; -1 never.
	RebalanceInterval time.Duration
	// MaxRetryDelay caps the pause between two in-process retries of a
	// message (its key's later messages wait through it). Defaults to 30s.
	MaxRetryDelay time.Duration
	// Strict keeps a key held after one of its messages was dead-lettered:
	// the key's later messages wait, in order, in PostgreSQL, until an
	// operator releases the key (the dead-lettered message runs again
	// first) or skips that message (inboxctl ordered). Released messages go
	// back through the outbox relay. Defaults to false: the key's next
	// message runs after a dead letter.
	Strict bool
}

// FairOpts spread a route over tenant shards behind a consistent-hash
// exchange (the broker's rabbitmq_consistent_hash_exchange plugin), as
// [OrderedOpts] does, but for fairness rather than order: producers
// publish to the exchange with the tenant (a customer's or an account's
// id) as routing key, every worker consumes every shard, and each worker
// gives its free slots to the tenants with messages waiting in it in
// proportion to their weights, so that one tenant's burst does not delay
// another's messages (docs/ordering.md, "Fair shares between tenants",
// states the bound). A tenant's messages run in parallel; retries run in
// process, in the tenant's share. The route's Tenant, when nil, is the
// routing key.
type FairOpts struct {
	// Shards is the number of shard queues "<queue>.shard.<i>": tenants
	// that hash to the same shard share its order. Defaults to 8.
	Shards int
	// Exchange is the exchange producers publish to. Defaults to the
	// queue name.
	Exchange string
	// Weights weigh tenants by routing key: a tenant of weight 3 gets
	// three slots for every one of a tenant of weight 1 while both have
	// messages waiting. A tenant not named weighs 1.
	Weights map[string]int
}

// LockOpts configure a route's Redis lock (RouteOpts.Lock): a random
// token, compare-and-delete release and a keep-alive; a copy whose key
// another worker holds is retried later without spending an attempt.
// Redis down or slow bypasses the lock (PostgreSQL decides alone).
type LockOpts struct {
	// TTL is the lock's lease, extended every TTL/3 while the handler
	// runs: the longest a crashed worker's keys wait for another worker.
	// From 1s to 10m. Defaults to 30s.
	TTL time.Duration
	// RetryDelay is how long a copy whose key is held waits before it is
	// tried again, doubling at each repeat, never past the holder's
	// remaining TTL. Defaults to 1s.
	RetryDelay time.Duration
}

// BreakerOpts configure a route's circuit breaker (RouteOpts.Breaker) on
// the downstream its handler calls: past Threshold of retryable failures
// over Window (and at least MinCalls), the worker stops consuming the
// route's queue, probes one delivery at a time after CoolDown and resumes
// on success. Deliveries it holds back spend no attempt. Routes naming the
// same Downstream share one breaker (the first route's settings). An
// inboxctl pause is never lifted by it.
type BreakerOpts struct {
	// Downstream names the system the handler calls. Defaults to
	// "default".
	Downstream string
	// Window is the span over which failures are counted. Defaults to 30s.
	Window time.Duration
	// Threshold is the share of failures that opens the breaker, in
	// (0, 1]. Defaults to 0.5.
	Threshold float64
	// MinCalls is the fewest calls in a window before it may open.
	// Defaults to 10.
	MinCalls int
	// CoolDown is how long the breaker stays open before it probes.
	// Defaults to 15s.
	CoolDown time.Duration
}

// RateLimitOpts configure a route's rate limit (RouteOpts.RateLimit) on
// calls to a downstream, shared by every worker through Config.Redis
// (GCRA): a delivery waits for its slot, or is deferred without spending
// an attempt. Without Redis (absent or down) each worker keeps to its
// share, Rate / ExpectedWorkers.
type RateLimitOpts struct {
	// Downstream names the limited system; routes naming the same one
	// share its limit. Defaults to "default".
	Downstream string
	// Rate is the calls per second allowed across all workers. Required.
	Rate float64
	// Burst is how many calls may go at once above the rate. Defaults to
	// 1.
	Burst int
	// ExpectedWorkers is the number of workers sharing the limit, for the
	// share each keeps to without Redis. Defaults to 1.
	ExpectedWorkers int
	// MaxWait is the longest a delivery waits for its slot before it is
	// deferred. Defaults to 2s.
	MaxWait time.Duration
}

// route is one registration, kept until a worker builds its router.
type route struct {
	queue string
	opts  RouteOpts
	err   error
	// mode is "tx", "batch" or "claim".
	mode string
	// build registers the route's handler, bound to store, in router.
	build func(router *consumer.Router, store *inbox.Store, hopts *consumer.HandlerOpts) error
}

func (r *route) namespace() string { return cmp.Or(r.opts.Namespace, r.queue) }

func (r *route) policy() retry.Policy {
	if r.opts.Retry != nil {
		return r.opts.Retry
	}
	return retry.DefaultPolicy
}

// queueOpts returns the route's queue settings for the consumer, defaults
// applied: quorum queues, the default tiers, and with group commit and no
// concurrency set, enough handlers to fill every batch in flight, with
// twice that prefetched.
func (r *route) queueOpts() consumer.QueueOpts {
	var q QueueOpts
	if r.opts.Queue != nil {
		q = *r.opts.Queue
	}
	out := consumer.QueueOpts{
		Type:            consumer.QueueType(cmp.Or(q.Type, Quorum)),
		Concurrency:     r.opts.Concurrency,
		Prefetch:        q.Prefetch,
		DeliveryLimit:   q.DeliveryLimit,
		RetryTiers:      q.RetryTiers,
		DeadLetterQueue: q.DeadLetterQueue,
		Arguments:       q.Arguments,
		NoDeclare:       q.NoDeclare,
	}
	if len(out.RetryTiers) == 0 {
		out.RetryTiers = consumer.DefaultRetryTiers
	}
	if out.Type == consumer.Quorum && out.DeliveryLimit == 0 {
		out.DeliveryLimit = 20
	}
	if gc := r.opts.GroupCommit; gc != nil && out.Concurrency <= 0 {
		out.Concurrency = gc.Concurrency()
		if out.Prefetch <= 0 {
			out.Prefetch = 2 * out.Concurrency
		}
	}
	return out
}

// orderedOpts returns the route's Ordered settings for the consumer.
func (r *route) orderedOpts() *consumer.OrderedOpts {
	if f := r.opts.Fair; f != nil {
		return &consumer.OrderedOpts{Shards: f.Shards, Exchange: f.Exchange, Fair: true, Weights: f.Weights}
	}
	o := r.opts.Ordered
	if o == nil {
		return nil
	}
	return &consumer.OrderedOpts{Shards: o.Shards, Exchange: o.Exchange, RebalanceInterval: o.RebalanceInterval, MaxRetryDelay: o.MaxRetryDelay}
}

// HandleTx registers fn for queue in transactional mode: fn runs once per
// idempotency key, in the transaction that records the key's inbox row,
// and its writes commit with it or not at all; the delivery is acked after
// the commit. T (or *T) must implement inboxtype.Keyer.
func HandleTx[T any](r *Routes, queue string, fn inbox.TxHandlerFunc[T], opts *RouteOpts) {
	add(r, queue, "tx", fn == nil, opts, func(s *inbox.Store, o *RouteOpts) inboxtype.Handler[T] {
		return inbox.Handler(s, fn, o.GroupCommit)
	})
}

// HandleBatch registers fn for queue in transactional mode, with fn
// queueing its writes instead of running them: the claim of the key, the
// writes and fn's result then reach PostgreSQL in one round trip, as one
// transaction. fn runs before the key is claimed (for duplicates too), so
// it must only build the batch; a handler that reads before it writes uses
// HandleTx. Everything HandleTx guarantees holds. T (or *T) must implement
// inboxtype.Keyer.
func HandleBatch[T any](r *Routes, queue string, fn inbox.BatchHandlerFunc[T], opts *RouteOpts) {
	add(r, queue, "batch", fn == nil, opts, func(s *inbox.Store, o *RouteOpts) inboxtype.Handler[T] {
		return inbox.BatchHandler(s, fn, o.GroupCommit)
	})
}

// HandleClaim registers fn for queue in claim mode, for effects outside
// PostgreSQL: the key is claimed first (a fenced, leased claim), fn calls
// out with the claim's key as its idempotency key and commits its
// business writes through Claim.Complete, which succeeds only while the
// claim holds. T (or *T) must implement inboxtype.Keyer.
func HandleClaim[T any](r *Routes, queue string, fn inbox.ClaimFunc[T], opts *RouteOpts) {
	add(r, queue, "claim", fn == nil, opts, func(s *inbox.Store, o *RouteOpts) inboxtype.Handler[T] {
		return inbox.ClaimHandler(s, fn, o.GroupCommit, o.Claim)
	})
}

func add[T any](r *Routes, queue, mode string, nilFn bool, opts *RouteOpts, handler func(*inbox.Store, *RouteOpts) inboxtype.Handler[T]) {
	if r == nil {
		panic("inboxmq: nil Routes")
	}
	rt := &route{queue: queue, mode: mode}
	if opts != nil {
		rt.opts = *opts
	}
	switch {
	case nilFn:
		rt.err = fmt.Errorf("inboxmq: route %q: nil handler", queue)
	case !reflect.TypeFor[*T]().Implements(reflect.TypeFor[inboxtype.Keyer]()):
		// The inbox, the cache and the lock all work on the key.
		rt.err = fmt.Errorf("inboxmq: route %q: payload %s does not implement inboxtype.Keyer: the inbox needs its idempotency key",
			queue, reflect.TypeFor[T]())
	case rt.opts.Claim != nil && mode != "claim":
		rt.err = fmt.Errorf("inboxmq: route %q: RouteOpts.Claim is for claim mode (HandleClaim)", queue)
	case rt.opts.Lock != nil && rt.opts.Lock.TTL != 0 && (rt.opts.Lock.TTL < time.Second || rt.opts.Lock.TTL > 10*time.Minute):
		rt.err = fmt.Errorf("inboxmq: route %q: RouteOpts.Lock.TTL %s: want 1s to 10m", queue, rt.opts.Lock.TTL)
	}
	rt.build = func(router *consumer.Router, s *inbox.Store, hopts *consumer.HandlerOpts) (err error) {
		defer func() {
			// The inbox panics on settings that are a start-up bug (a
			// lease shorter than its heartbeat): an error here.
			if p := recover(); p != nil {
				err = fmt.Errorf("%v", p)
			}
		}()
		o := rt.opts
		return consumer.RegisterSafely(router, queue, handler(s, &o), hopts)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.routes = append(r.routes, rt)
}

// snapshot returns the routes registered so far (none for a nil r).
func (r *Routes) snapshot() []*route {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*route(nil), r.routes...)
}
