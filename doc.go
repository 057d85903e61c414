// Package inboxmq runs RabbitMQ workers in which a duplicate delivery never
// causes a duplicate effect: the idempotency key comes from the payload's
// business identity, a PostgreSQL inbox row commits in the same transaction
// as the business write, and a delivery is acked only after that commit.
//
// A [Worker] is the whole runtime of one process. Build it from one
// [Config] with [NewWorker], and run it with [Worker.Run] (or
// [Worker.Start] and [Worker.Stop]): it owns the consumer, the inbox store,
// the metrics and health endpoints, the runtime controls, the outbox relay
// and the maintenance jobs. Nothing is wired by hand, and what a team
// always wants is on unless a Config field turns it off.
//
// # Routes
//
// A route is a queue, a typed handler and its [RouteOpts]. Register them on
// [Routes] with the free generic functions [HandleTx] (transactional mode:
// the handler writes in the inbox's transaction), [HandleBatch] (the same,
// with the writes queued so that they travel with the claim) and
// [HandleClaim] (claim mode, for effects outside PostgreSQL such as a
// payment gateway). The payload type must implement inboxtype.Keyer: its
// IdempotencyKey is what the inbox, the completed-cache and the lock work
// on.
//
//	routes := inboxmq.NewRoutes()
//	inboxmq.HandleTx(routes, "payments", func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[Payment]) error {
//		_, err := tx.Exec(ctx, `INSERT INTO payments (order_id, cents) VALUES ($1, $2)`, msg.Body.OrderID, msg.Body.Cents)
//		return err
//	}, nil)
//
//	w, err := inboxmq.NewWorker(&inboxmq.Config{
//		URL:    "amqp://guest:guest@127.0.0.1:5672/",
//		DB:     pool, // *pgxpool.Pool on the primary, migrations applied
//		Routes: routes,
//		Addr:   ":9464", // /metrics, /healthz, /readyz
//	})
//	if err != nil { … }
//	return w.Run(ctx) // until ctx ends (SIGTERM), then a graceful stop
//
// # What the worker mounts
//
// On every route, outermost first: a trace span, the handler timeout;
// then, after decoding, the parking of blocked keys (the runtime
// controls), the completed-cache (with Config.Redis), the breaker, the
// Redis lock and the rate limit (when the route has them), the route's own
// middleware and the inbox. The
// consumer runs the chain under one recover and reports every outcome to
// the log, the metrics and the inbox (dead letters mark their rows).
//
// # Lifecycle
//
// [NewWorker] validates and builds every part without I/O. [Worker.Start]
// starts the health listener first, so that /readyz names what start-up
// waits for; then it checks the inbox table on the primary, declares the
// exchanges, and starts the maintenance jobs, the controls, the outbox
// relay, the worker's presence row (which inboxctl workers lists) and the
// consumer last. Each wait is bounded by Config.ConnectTimeout.
// [Worker.Stop] stops them in reverse order — the consumer first
// (in-flight deliveries finish, the rest are requeued) — within
// Config.StopTimeout. A Start that fails stops what it started.
//
// The README and docs/guarantees.md say what is guaranteed and which test
// proves it; [Version] names the release.
package inboxmq
