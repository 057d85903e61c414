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
// Without GATEWAY_URL the handler is transactional (inbox.Handler): the
// payments row, the ledger entry and a payment.completed outbox message are
// written in the transaction that records the inbox row. With GATEWAY_URL
// it runs in claim mode (inbox.ClaimHandler): the charge is posted with
// Idempotency-Key "payment:<order_id>" and the rows are written by the
// fenced completion.
//
// # Configuration
//
// Everything comes from the environment (AMQP_URL, DATABASE_URL, REDIS_URL,
// PAYMENT_QUEUE, GATEWAY_URL, LOCK_TTL, WORKER_CONCURRENCY, GROUP_COMMIT, METRICS_ADDR);
// see README.md for defaults. The migrations are embedded: the binary runs
// from any folder.
package main
