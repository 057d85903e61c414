// Package middleware holds the worker's delivery middleware: decorators of
// [inboxtype.DeliveryHandler] that run around the decode and handler step.
// The worker (package inboxmq) mounts them from its Config and RouteOpts;
// the log and metrics observers live in internal/logs and internal/metrics.
//
// Middleware never acks or nacks. It returns an error (or nil), and the
// consumer classifies the final error (package retry) into an AMQP outcome.
//
// # Order
//
// Router-wide middleware (Router.Use) runs before decoding; handler
// middleware (HandlerOpts.Middleware) runs after it, so it sees
// Delivery.Key. Outermost first:
//
//	Tracing -> Timeout -> [decode] -> Block -> Cache -> Lock -> Breaker -> RateLimit -> inbox handler
//
// The cache goes in front of the lock, so a delivery it answers takes no
// lock:
//
//	r.Use(middleware.Tracing(nil, nil), middleware.Timeout(2*time.Minute))
//	lck, err := middleware.Lock(rdb, nil)
//	consumer.Register(r, "payments", h, &consumer.HandlerOpts{
//		Middleware: []inboxtype.Middleware{middleware.Cache(rdb, nil), lck},
//	})
//
// # Panics and Timeout
//
// There is no recover middleware: the consumer runs the whole chain under
// one last guard that turns a panic into an error with reason "panic" and
// logs its stack once, so the worker lives on and a crashing message is
// retried and finally dead-lettered. [Timeout] gives each delivery a
// deadline whose cause is [ErrTimeout].
//
// # Redis: an accelerator, never the judge
//
// [Cache] (the completed-cache) and [Lock] use Redis to save work, never
// to decide correctness: the PostgreSQL inbox keeps every effect single
// with Redis absent, flushed, slow or partitioned.
//
//   - Cache stores positive entries only: the fingerprint of the job that
//     completed. A copy with that fingerprint is acked as a duplicate from
//     source "cache"; a miss, an error or another fingerprint (another job
//     reusing the key) falls through to the inbox, which has the final
//     word. Entries are written only after a commit.
//   - Lock holds a lock per (namespace, key) with a keep-alive, so two
//     workers do not both run a handler for the same key; the other one is
//     retried later with reason "lock_unavailable". Its fencing token is
//     set on Delivery.LockFence. A lock that is lost before the handler
//     returns cancels the handler's context with cause lock.ErrLockLost
//     or lock.ErrMaxHoldReached (package internal/lock).
//
// Lock and Cache need the idempotency key: a delivery without one (the
// middleware mounted router-wide, or on a route whose payload is no Keyer)
// fails permanently with an error naming the misconfiguration.
//
// Each Redis call has a short timeout (150ms by default). When Redis errors
// or times out, the delivery proceeds without it, and the change is reported
// once through the OnDegraded hook and the logger; while degraded, Redis is
// probed at most once per ProbeInterval, and the middleware recovers by
// itself when Redis answers. Build the client with ContextTimeoutEnabled so
// the timeouts bound socket reads too.
//
// # A downstream: circuit breaker and shared rate limit
//
// [Breaker] (sony/gobreaker's state machine) guards the routes that call
// one downstream: past a share of retryable failures over a window it
// pauses their queues through a [Restricter] (the consumer, under a reason
// of its own, so an operator's pause is never undone by it), defers what
// still reaches it without counting an attempt, and probes one delivery
// at a time after a cool-down. [RateLimit] keeps the calls to a downstream
// within a rate shared by every worker (a GCRA slot reserved in Redis per
// delivery, waited for or deferred without counting an attempt), each
// worker keeping to its share of the rate while Redis is down. Neither
// ever dead-letters a delivery.
//
// # Observability
//
// [Tracing] starts one consumer span per delivery as a child of the trace
// context in the AMQP headers ([InjectHeaders] writes it on the publishing
// side), and sets Delivery.TraceID, which the metrics observer attaches
// to its latencies as an exemplar. It reports the outcome the consumer
// settled the delivery on (inboxtype.Delivery's OnSettled hooks), never a
// classification of its own; every count and latency, the handler's run
// time (Outcome.Handled) included, comes from the metrics observer
// (internal/metrics). Lock starts a "lock.acquire" span under the span in the
// context. Recommended order: Tracing first, then the rest.
package middleware
