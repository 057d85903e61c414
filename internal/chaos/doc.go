// Package chaos is inboxmq's fault-injection suite: it drives the
// payment-worker example as real subprocesses, breaks things around them on
// a seeded schedule, and then proves from the database, the broker and a
// recording fake gateway that no order was applied twice and none was lost.
//
// # Why it has its own home
//
// The suite is not a unit test of one package: it builds a binary, starts
// several processes, kills them, and talks to the broker, PostgreSQL and
// Redis as an operator would (rabbitmqctl, pg_terminate_backend). It needs a
// runner usable outside go test (cmd/inboxchaos, for long runs and replays),
// a Go test for CI (a bounded run, see chaos_test.go), and code shared by
// both. Putting it in the example or in the consumer's tests would tie the
// framework's tests to subprocess machinery and the example to its own
// referee. Users' handler tests belong to package inboxtest instead.
//
// # A run
//
// For each scenario ([ScenarioInbox]: effects only in PostgreSQL;
// [ScenarioGateway]: each payment is also charged at a recording fake
// [Gateway]) [Run] creates a fresh schema and queue, runs
// `payment-worker migrate` twice, starts Config.Workers `payment-worker run`
// processes, publishes every order 1–3 times under different message ids
// plus poison messages (and, with the gateway, orders it declines), and
// meanwhile injects faults:
//
//   - kill: SIGKILL a worker, then restart it;
//   - restart: SIGTERM a worker (it must exit 0 within 30 s), restart it;
//   - broker-conn: close the worker's AMQP connection from the server side;
//   - pg-terminate: pg_terminate_backend on the worker's backends;
//   - redis-flush: delete the run's Redis keys (never FLUSHALL);
//   - redis-restart: stop and restart the shared Redis (only with
//     Config.RestartRedis);
//   - stop: SIGSTOP a worker for LOCK_TTL + 1 s, then SIGCONT it;
//   - gateway-slow, gateway-fail: a slow gateway; one that answers 503 or
//     charges and then answers 500.
//
// Then it heals everything, waits for the drain, stops the workers with
// SIGTERM and runs [Check]: exactly one ledger entry and payments row per
// order, one created charge per key, nothing for poison or declined
// messages, each of them in <queue>.dlq with its x-error, and nothing left
// in the work and retry queues.
//
// # Replay
//
// Every random choice comes from Config.Seed (math/rand/v2), printed at the
// start and in the report:
//
//	go run ./cmd/inboxchaos -seed 42 -orders 500 -workers 4 -duration 60s
//
// Timing still differs between runs, so a replay repeats the schedule and
// the inputs, not the exact interleaving.
package chaos
