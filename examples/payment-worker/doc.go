// Command payment-worker is the inboxmq example: a RabbitMQ worker that
// records payments in PostgreSQL so that a duplicate delivery can never
// charge or book an order twice.
//
// # Commands
//
//	payment-worker migrate   # framework + example tables, safe to run twice
//	payment-worker run       # consume PAYMENT_QUEUE until SIGINT/SIGTERM
//	payment-worker publish   # demo: publish a burst of orders with duplicates
//	payment-worker report    # demo: wait for the drain, count the effects
//
// # Modes
//
// The wiring is one inboxmq.Worker (worker.go): it owns the consumer, the
// metrics and health listener, the runtime controls, the outbox relay, the
// reconciler and retention, and their start and stop.
//
// Without GATEWAY_URL the handler is transactional (inboxmq.HandleBatch): the
// payments row, the ledger entry and a payment.completed outbox message are
// written in the transaction that records the inbox row, sent with the
// claim of the key and the result in one round trip. With GATEWAY_URL
// it runs in claim mode (inboxmq.HandleClaim): the charge is posted with
// Idempotency-Key "payment:<order_id>" and the rows are written by the
// fenced completion.
//
// # Configuration
//
// Everything comes from the environment (AMQP_URL, DATABASE_URL, REDIS_URL,
// PAYMENT_QUEUE, GATEWAY_URL, LOCK_TTL, WORKER_CONCURRENCY, GROUP_COMMIT, METRICS_ADDR,
// and, off by default, BREAKER and GATEWAY_RATE_LIMIT: a circuit breaker on
// the gateway and a rate limit shared by every worker); see README.md for
// defaults. The migrations are embedded: the binary runs
// from any folder.
package main
