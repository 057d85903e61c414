// Package outbox is the publishing half of the inbox pattern: a
// transactional outbox and the relay that publishes it to RabbitMQ.
//
// It has its own home, apart from package inbox, because it runs on the
// other side of the broker. The inbox makes a received message's effect
// happen once; the outbox makes a message leave only if the transaction
// that decided to send it commits. Between the two, the stable message id
// and idempotency key carry the message's identity, so the one duplicate
// the outbox can produce (a relay crash between the broker's confirm and
// the mark) is absorbed by the receiver's inbox.
//
// # Enqueue
//
// A handler writes its outgoing messages with the same pgx.Tx as its
// business writes ([Enqueue], [EnqueueBatch]). A rolled-back transaction
// publishes nothing; a committed one wakes the relays through NOTIFY, which
// PostgreSQL delivers only on commit. A process that runs its own relay can
// wake it in-process instead ([Relay.WakeLocally]); inboxmq.Worker does so
// for its handlers.
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, `UPDATE accounts SET …`); err != nil {
//			return err
//		}
//		return outbox.Enqueue(ctx, tx, outbox.Message{
//			Exchange:       "payments",
//			RoutingKey:     "payment.captured",
//			IdempotencyKey: "payment-42/captured", // the id derives from it
//			OrderingKey:    "account-7",
//			ContentType:    "application/json",
//			Body:           body,
//		})
//	})
//
// A handler that sends its writes as one pgx.Batch adds the messages to
// that batch with [AddToBatch] instead: the writes and the outbox rows then
// cost one round trip.
//
// The message id is never random: it is Message.ID or [DeriveID] of the
// destination and the idempotency key, so a handler re-run produces the
// same id (and enqueueing an id already in the table is a no-op). The
// idempotency key travels in the x-idempotency-key header, and the W3C
// trace context of ctx in traceparent/tracestate.
//
// # Relay
//
// A [Relay] ([NewRelay], [RelayConfig]) claims pending rows in batches,
// publishes them persistent and mandatory on a confirm channel, and marks
// them sent in the same transaction only after the broker's confirm.
// Several relays may run at once, and each relay runs
// RelayConfig.Concurrency batches at once (one publishes while another
// commits); a row is claimed by one batch at a time, so in normal
// operation each row goes out once. It wakes on LISTEN/NOTIFY and polls as
// a fallback (the statements are in docs/internals.md). A broker or database outage only delays rows: the relay
// reconnects with exponential backoff (cenkalti/backoff) and the rows go
// out after it. A nacked or unroutable row backs off on its own
// (RetryMinDelay·2ⁿ) and keeps its place in its ordering key.
//
//	relay, err := outbox.NewRelay(pool, &outbox.RelayConfig{URL: amqpURL, Ordered: true})
//	…
//	err = relay.Start(ctx) // runs in the background
//	…
//	err = relay.Stop(ctx) // finishes the batches in flight, bounded by ctx
//
// # Ordering
//
// With RelayConfig.Ordered, rows that share an ordering key go out one at a
// time: a row is claimed only when no earlier row of its key is unsent, so
// it is published after the previous one was confirmed, even across
// relays. "Earlier" is id (insert) order, which is commit order when the
// transactions that write one aggregate serialise on it, as business writes
// to the same row do.
//
// To keep that order up to the handlers, send an aggregate's messages to
// an ordered route (consumer.OrderedOpts): Exchange is the route's
// consistent-hash exchange, and RoutingKey and OrderingKey are both the
// aggregate's id. The routing key puts all of the aggregate's messages in
// one shard queue, the ordering key makes the relay publish them in
// order, and the route applies them in that order.
//
// # Retention
//
// Sent rows stay for RelayConfig.Retention (default 24h) and are then
// deleted in small batches ([Relay.PurgeSent]); while a row stays,
// re-enqueueing its id is a no-op.
//
// # Metrics
//
// Under the namespace inboxmq, on RelayConfig.Registerer:
// outbox_pending_rows, outbox_oldest_pending_age_seconds,
// outbox_published_total, outbox_publish_failed_total{reason} and the
// histogram outbox_relay_lag_seconds (row creation to confirm). Each batch
// is logged at debug level, failures at warn; the broker URL is logged
// without its password.
package outbox
