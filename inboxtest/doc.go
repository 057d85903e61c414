// Package inboxtest checks that your handler has exactly one effect per
// job, whatever the broker and the infrastructure do to its deliveries. Use
// it from your own _test.go files, against the same PostgreSQL (and Redis)
// your handler uses in production.
//
// # What it checks
//
// Give [Run] (or [Check]) a [Subject]: the inboxmq.Worker holding your
// route (built with NewWorker as in production, not started) and its
// queue, a function producing fresh jobs, and a function counting a job's
// committed effects. Each scenario delivers a job through the route's
// complete chain (the worker's middleware, the completed-cache and the
// lock when it has Redis, decoding, the inbox, your handler) the way the
// broker would, settles every copy (a
// retry comes back with attempt+1, a crashed delivery comes back
// redelivered), and then requires exactly one effect:
//
//   - sequential duplicates: the job arrives several times, one after the
//     other, under different message ids;
//   - concurrent duplicates: the copies arrive at once;
//   - crash before commit: the business writes were made and the COMMIT
//     fails ([ErrInjectedCommitFailure]), at each COMMIT the delivery makes
//     in turn; the delivery is redelivered;
//   - crash between commit and ack: the same message is redelivered after
//     its effect committed;
//   - lock loss mid-handler: copy A is paused at its COMMIT, its lock
//     vanishes, copy B runs, and A's context is cancelled with
//     [ErrLockLost] as the lock middleware does;
//   - Redis flush between copies: the cache and lock keys vanish between
//     two copies.
//
// A handler that writes outside the inbox transaction, or that is not
// behind the inbox at all, fails: an effect happens twice.
//
// # Wiring
//
// The crash and lock-loss scenarios need a [Faults] installed on the pool
// of the inbox store (it only acts on the harness's own deliveries):
//
//	faults := &inboxtest.Faults{}
//	cfg, _ := pgxpool.ParseConfig(databaseURL)
//	faults.Instrument(cfg)
//	pool, _ := pgxpool.NewWithConfig(ctx, cfg)
//	routes := inboxmq.NewRoutes()
//	inboxmq.HandleTx(routes, "payments", recordPayment, nil)
//	w, _ := inboxmq.NewWorker(&inboxmq.Config{URL: amqpURL, DB: pool, Routes: routes})
//
//	inboxtest.Run(t, inboxtest.Subject{
//		Worker:  w,
//		Queue:   "payments",
//		Message: func(n int) []byte { return []byte(fmt.Sprintf(`{"order_id":"o-%d","amount_cents":100}`, n)) },
//		Effects: countLedgerEntries,
//		Faults:  faults,
//	})
//
// No broker is needed: deliveries are built in memory. Isolate each test as
// the project's own tests do (a schema per test, a Redis key prefix per
// test) so tests can run in parallel.
package inboxtest
