package inboxmq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/middleware"
	"github.com/inboxmq/inboxmq/retry"
)

// Routes are the handlers of a [Worker], one per queue. Build them with
// [NewRoutes] and register with [HandleTx] or [HandleClaim] before passing
// them in Config.Routes. A registration error (a nil handler, a payload
// without an idempotency key) is kept and returned by [NewWorker], naming
// the queue. Routes may serve several workers; they are safe for
// concurrent registration.
type Routes struct {
	mu     sync.Mutex
	routes []*route
}

// NewRoutes returns an empty set of routes.
func NewRoutes() *Routes { return &Routes{} }

// RouteOpts are the settings of one route. A nil *RouteOpts means
// defaults.
type RouteOpts struct {
	// Namespace is the inbox namespace: the idempotency key is unique per
	// (namespace, key), and controls (inboxctl) name it. Defaults to the
	// queue name.
	Namespace string
	// Queue is the queue's topology and concurrency. The zero value is
	// usable (a classic queue, 8 at once). With GroupCommit set and
	// Queue.Concurrency 0, the concurrency is enough handlers to fill
	// every batch in flight (GroupCommit's MaxBatch × MaxInFlight: 128 at
	// the defaults, 512 with Pipeline), with a prefetch of twice that
	// unless Queue.Prefetch is set: group commit only pays when many
	// deliveries are handled at once.
	Queue consumer.QueueOpts
	// Codec decodes payloads. Defaults to JSON.
	Codec consumer.Codec
	// GroupCommit lets deliveries handled concurrently share one
	// transaction (in claim mode, their completions). Leave
	// Queue.Concurrency at 0 with it: the route then handles enough
	// deliveries at once to fill its batches (see Queue). Its zero fields
	// take the store's settings (inbox.StoreConfig.GroupCommit), else
	// inbox.GroupCommit's defaults, except MaxBatch with Pipeline: 256,
	// since a pipelined batch takes no savepoint (only a batch that fails
	// runs again with one per delivery, slower past 64). Defaults to nil:
	// one transaction per delivery.
	GroupCommit *inbox.GroupCommit
	// StorePayload keeps the payload in the inbox row, for replay by the
	// reconciler. Defaults to false.
	StorePayload bool
	// Claim holds claim mode's lease settings (Lease, MaxLease, Heartbeat,
	// DurableClaim) for [HandleClaim]; its GroupCommit and StorePayload are
	// ignored in favour of the fields above. Ignored by [HandleTx].
	// Defaults to nil: inbox.ClaimOpts's defaults.
	Claim *inbox.ClaimOpts
	// Reply answers requests (RabbitMQ RPC): a delivery with reply_to that
	// completes, or is a duplicate of a completed key, gets a reply to
	// reply_to under its own correlation_id, carrying the result the
	// handler stored with inboxtype.Message.SetResult (the same bytes for
	// every copy), after the commit and before the ack
	// (consumer.ReplyOpts). Defaults to false: no replies.
	Reply bool
	// Faults publishes a fault event through the outbox when the route
	// dead-letters a message (see FaultOpts). Defaults to nil: none.
	Faults *FaultOpts
	// Rules are classification rules tried before retry's built-in
	// taxonomy. Defaults to none.
	Rules []retry.Rule
	// Policy bounds and spaces broker-side retries. Defaults to
	// retry.DefaultPolicy.
	Policy retry.Policy
	// InProcess is the short in-process retry for blips. Defaults to
	// retry.InProcess's zero value.
	InProcess retry.InProcess
	// Middleware runs after decoding, inside the worker's block, cache and
	// lock middleware, outermost first. Defaults to none.
	Middleware []inboxtype.Middleware
	// NoCache leaves out the completed-cache that the worker mounts when
	// Config.Redis is set. Defaults to false.
	NoCache bool
	// Cache configures the completed-cache (its Logger and OnDegraded are
	// the worker's). On a route that takes the lock too, the lock keeps the
	// cache (middleware.LockOpts.Cache): only Prefix and TTL apply, the
	// lock's call timeout and probe serve both. Defaults to nil:
	// middleware.Cache's defaults.
	Cache *middleware.CacheOpts
	// LockMode says whether the route takes the Redis lock on each
	// delivery's key when Config.Redis is set (see [LockMode]). Defaults to
	// LockAuto: no lock, in either mode. The inbox already keeps concurrent
	// copies apart: in transactional mode ([HandleTx]) a copy waits for the
	// first's commit, in claim mode ([HandleClaim]) it meets the first's
	// live claim and looks again later (docs/performance.md, "Does the lock
	// earn its keep?").
	LockMode LockMode
	// NoLock leaves out the Redis lock whatever LockMode says; LockOff
	// does the same. Defaults to false.
	NoLock bool
	// Lock configures the lock (its Logger and OnDegraded are the
	// worker's). Defaults to nil: middleware.Lock's defaults.
	Lock *middleware.LockOpts
	// Breaker puts the route behind a circuit breaker on the downstream
	// its handler calls (middleware.Breaker): when the share of retryable
	// failures over the window passes the threshold, the worker stops
	// consuming the queue (apart from an inboxctl pause, which the breaker
	// never lifts), probes one delivery at a time after the cool-down and
	// resumes on success; deliveries it holds back spend no attempt and
	// are never dead-lettered by it. Routes whose Breaker names the same
	// Downstream share one breaker, with the first route's settings. Its
	// Target, Logger and OnStateChange are the worker's (metrics, logs,
	// and, with the controls on, the state inboxctl shows); IsFailure
	// defaults to the route's Rules and retry's taxonomy. Defaults to nil:
	// no breaker.
	Breaker *middleware.BreakerOpts
	// Ordered consumes the route through shard queues behind a
	// consistent-hash exchange, with per-key order across workers: the
	// messages of one ordering key (the routing key producers publish
	// with to the exchange, by default named after the queue) apply one
	// at a time, in publish order, while different keys run in parallel
	// on every worker; workers that join or leave share the shards out
	// by themselves. Retries then run in process and hold the key's later
	// messages back until the message succeeds or is dead-lettered (see
	// consumer.OrderedOpts and docs/scaling.md, "Ordering"). Needs the
	// broker's rabbitmq_consistent_hash_exchange plugin. Defaults to nil:
	// one work queue, no order between messages.
	Ordered *consumer.OrderedOpts
	// RateLimit limits the route's calls to a downstream across every
	// worker (middleware.RateLimit) through Config.Redis, or to each
	// worker's share of it without Redis. A delivery waits for its slot
	// or is deferred without spending an attempt. Its Logger, OnDegraded
	// and OnWait are the worker's. Defaults to nil: no limit.
	RateLimit *middleware.RateLimitOpts
}

// LockMode says whether a route takes the Redis lock (middleware.Lock)
// when the worker has Redis. With the completed-cache too, the two share
// their round trips: one before the handler and one after.
type LockMode int

// Values of RouteOpts.LockMode.
const (
	// LockAuto is the default chosen from measurements: today no lock, in
	// either mode. In both, the inbox is what keeps a key's copies from
	// doubling an effect, and the lock only changes where a concurrent copy
	// waits, at two Redis operations per delivery; on duplicate-free
	// traffic that is throughput lost for nothing. A route that leaves
	// LockMode at LockAuto follows the default if a later release changes
	// it; LockOff pins it.
	LockAuto LockMode = iota
	// LockOn takes the lock in either mode. With the completed-cache it
	// keeps most concurrent copies out of PostgreSQL (they are deferred,
	// then acked by the cache): take it when database connections, not
	// throughput, run out under bursts of copies.
	LockOn
	// LockOff never takes the lock.
	LockOff
)

// route is one registration, kept until a worker builds its router.
type route struct {
	queue string
	opts  RouteOpts
	err   error
	// register adds the route to router with hopts and returns the function
	// that, once the worker has its store, builds the inbox handler.
	register func(router *consumer.Router, hopts *consumer.HandlerOpts, gc *inbox.GroupCommit) (bind func(*inbox.Store), err error)
}

func (r *route) namespace() string { return cmp.Or(r.opts.Namespace, r.queue) }

// lockOn reports whether the route takes the Redis lock when the worker
// has Redis.
func (r *route) lockOn() bool {
	return r.opts.LockMode == LockOn && !r.opts.NoLock
}

// Group commit's defaults when neither the route nor the store sets them:
// inbox.GroupCommit's, except that a pipelined route's batches are larger
// (RouteOpts.GroupCommit).
const (
	defaultGroupMaxBatch     = 64
	defaultPipelinedMaxBatch = 256
	defaultGroupMaxInFlight  = 2
)

// groupCommit returns the route's group commit with MaxBatch and
// MaxInFlight resolved (the route's, else the store's, else the façade's
// defaults), or nil without group commit.
func (r *route) groupCommit(store *inbox.StoreConfig) *inbox.GroupCommit {
	gc := r.opts.GroupCommit
	if gc == nil {
		return nil
	}
	var def inbox.GroupCommit
	if store != nil {
		def = store.GroupCommit
	}
	batch := defaultGroupMaxBatch
	if gc.Pipeline || def.Pipeline {
		batch = defaultPipelinedMaxBatch
	}
	out := *gc
	out.MaxBatch = cmp.Or(max(gc.MaxBatch, 0), max(def.MaxBatch, 0), batch)
	out.MaxInFlight = cmp.Or(max(gc.MaxInFlight, 0), max(def.MaxInFlight, 0), defaultGroupMaxInFlight)
	return &out
}

// queueOpts returns the route's queue settings. With group commit and no
// concurrency set, enough handlers run at once to fill MaxInFlight
// batches of MaxBatch (groupCommit), with twice that prefetched: with the
// per-message default of 8, a batch could never hold more than 8
// deliveries and group commit would be slower than one transaction each.
func (r *route) queueOpts(store *inbox.StoreConfig) consumer.QueueOpts {
	q := r.opts.Queue
	gc := r.groupCommit(store)
	if gc == nil || q.Concurrency > 0 {
		return q
	}
	q.Concurrency = gc.MaxBatch * gc.MaxInFlight
	if q.Prefetch <= 0 {
		q.Prefetch = 2 * q.Concurrency
	}
	return q
}

// HandleTx registers fn for queue in transactional mode (inbox.Handler):
// fn runs once per idempotency key, in the transaction that records the
// inbox row, and its writes commit with it or not at all. T (or *T) must
// implement inboxtype.Keyer.
func HandleTx[T any](r *Routes, queue string, fn inbox.TxHandlerFunc[T], opts *RouteOpts) {
	add(r, queue, fn == nil, opts, func(s *inbox.Store, o *RouteOpts) inboxtype.Handler[T] {
		return inbox.Handler(s, fn, &inbox.HandlerOpts{GroupCommit: o.GroupCommit, StorePayload: o.StorePayload})
	})
}

// HandleBatch registers fn for queue in transactional mode with
// inbox.BatchHandler: fn queues its writes instead of running them, and
// the claim of the key, the writes and fn's result travel to PostgreSQL in
// one round trip, as one transaction. fn runs before the key is claimed
// (for duplicates too), so it must only build the batch; a handler that
// reads before it writes uses HandleTx. Everything HandleTx guarantees
// holds. T (or *T) must implement inboxtype.Keyer.
func HandleBatch[T any](r *Routes, queue string, fn inbox.BatchHandlerFunc[T], opts *RouteOpts) {
	add(r, queue, fn == nil, opts, func(s *inbox.Store, o *RouteOpts) inboxtype.Handler[T] {
		return inbox.BatchHandler(s, fn, &inbox.HandlerOpts{GroupCommit: o.GroupCommit, StorePayload: o.StorePayload})
	})
}

// HandleClaim registers fn for queue in claim mode (inbox.ClaimHandler),
// for effects outside PostgreSQL: the key is claimed first, fn calls out
// with the claim's key and commits through Claim.Complete. T (or *T) must
// implement inboxtype.Keyer.
func HandleClaim[T any](r *Routes, queue string, fn inbox.ClaimFunc[T], opts *RouteOpts) {
	add(r, queue, fn == nil, opts, func(s *inbox.Store, o *RouteOpts) inboxtype.Handler[T] {
		var co inbox.ClaimOpts
		if o.Claim != nil {
			co = *o.Claim
		}
		co.GroupCommit, co.StorePayload = o.GroupCommit, o.StorePayload
		return inbox.ClaimHandler(s, fn, &co)
	})
}

func add[T any](r *Routes, queue string, nilFn bool, opts *RouteOpts, build func(*inbox.Store, *RouteOpts) inboxtype.Handler[T]) {
	rt := &route{queue: queue}
	if opts != nil {
		rt.opts = *opts
	}
	switch {
	case r == nil:
		panic("inboxmq: nil Routes")
	case nilFn:
		rt.err = fmt.Errorf("inboxmq: route %q: nil handler", queue)
	case rt.opts.LockMode < LockAuto || rt.opts.LockMode > LockOff:
		rt.err = fmt.Errorf("inboxmq: route %q: unknown LockMode %d", queue, rt.opts.LockMode)
	case !reflect.TypeFor[*T]().Implements(reflect.TypeFor[inboxtype.Keyer]()):
		// The inbox, the cache and the lock all work on the key.
		rt.err = fmt.Errorf("inboxmq: route %q: payload %s does not implement inboxtype.Keyer: the inbox, the cache and the lock need its idempotency key",
			queue, reflect.TypeFor[T]())
	}
	rt.register = func(router *consumer.Router, hopts *consumer.HandlerOpts, gc *inbox.GroupCommit) (func(*inbox.Store), error) {
		// The store exists only once Start has reached PostgreSQL: the
		// router calls the handler built then (before the consumer starts).
		var h inboxtype.Handler[T]
		proxy := inboxtype.HandlerFunc[T](func(ctx context.Context, msg *inboxtype.Message[T]) error {
			if h == nil {
				return errors.New("inboxmq: worker not started")
			}
			return h.Handle(ctx, msg)
		})
		if err := consumer.RegisterSafely(router, queue, proxy, hopts); err != nil {
			return nil, err
		}
		o := rt.opts
		o.GroupCommit = gc
		return func(s *inbox.Store) { h = build(s, &o) }, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.routes = append(r.routes, rt)
}

// snapshot returns the routes registered so far.
func (r *Routes) snapshot() []*route {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*route(nil), r.routes...)
}
