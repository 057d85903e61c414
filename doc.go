// Package inboxmq runs RabbitMQ workers in which a duplicate delivery never
// causes a duplicate effect: the idempotency key comes from the payload's
// business identity, a PostgreSQL inbox row commits in the same transaction
// as the business write, and a delivery is acked only after that commit.
//
// A [Worker] is the whole runtime of one process. Build it from one
// [Config] with [NewWorker], and run it with [Worker.Run] (or
// [Worker.Start] and [Worker.Stop]): it owns the consumer, the inbox store,
// and the optional parts each Config section turns on. Nothing is wired by
// hand.
//
// # Routes
//
// A route is a queue, a typed handler and its options. Register them on
// [Routes] with the free generic functions [HandleTx] (transactional mode:
// the handler writes in the inbox's transaction) and [HandleClaim] (claim
// mode, for effects outside PostgreSQL such as a payment gateway). The
// payload type must implement inboxtype.Keyer: its IdempotencyKey is what
// the inbox, the completed-cache and the lock work on.
//
//	routes := inboxmq.NewRoutes()
//	inboxmq.HandleTx(routes, "payments", func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[Payment]) error {
//		_, err := tx.Exec(ctx, `INSERT INTO payments (order_id, cents) VALUES ($1, $2)`, msg.Body.OrderID, msg.Body.Cents)
//		return err
//	}, nil)
//
//	w, err := inboxmq.NewWorker(&inboxmq.Config{
//		URL:    "amqp://guest:guest@127.0.0.1:5672/",
//		DB:     pool,   // *pgxpool.Pool on the primary, migrations applied
//		Redis:  rdb,    // optional: completed-cache and lock
//		Routes: routes,
//		Health: &inboxmq.HealthConfig{Addr: ":9464"},
//	})
//	if err != nil { … }
//	return w.Run(ctx) // until ctx ends (SIGTERM), then a graceful stop
//
// # What the worker mounts
//
// On every route, outermost first: recovery from panics, a trace span,
// handler timing (with Config.Metrics), the handler timeout; then, after
// decoding, the parking of blocked keys (unless Config.Controls.Disabled), the
// completed-cache (with Config.Redis, unless RouteOpts.NoCache) and the
// lock (with Config.Redis, on routes with RouteOpts.LockMode LockOn), the
// route's own middleware and the inbox. The
// consumer reports every transition to the log, the metrics and the inbox
// (dead letters mark their rows).
//
// # Lifecycle
//
// [NewWorker] validates without I/O. [Worker.Start] starts the health
// listener first, so that /readyz names what start-up waits for; then it
// waits for PostgreSQL (the inbox table), starts the controls, the
// worker's presence row (which inboxctl workers lists), the outbox relay,
// the reconciler and the retention job, and the consumer last. Each
// wait is bounded by Config.ConnectTimeout. [Worker.Stop] stops the
// consumer first (in-flight deliveries finish, the rest are requeued), then
// the relay, then the other services and the listener, all within
// Config.StopTimeout. A Start that fails stops what it started.
//
// # Lower-level packages
//
// The worker is assembled from packages that stay usable on their own:
// consumer (the AMQP runtime and the router), inbox (the PostgreSQL inbox,
// reconciler and retention), retry (the error taxonomy), middleware, lock,
// control (pause, concurrency, blocked keys, worker presence), outbox,
// metrics and observe.
// The README and docs/guarantees.md say what is guaranteed and which test
// proves it; [Version] names the release.
package inboxmq
