// Package outbox is the publishing half of the inbox pattern: a handler
// enqueues its outgoing messages in the transaction of its business
// writes, and the worker's relay publishes them to RabbitMQ once that
// transaction has committed.
//
// The inbox makes a received message's effect happen once; the outbox
// makes a message leave only if the transaction that decided to send it
// commits. Between the two, the stable message id and idempotency key
// carry the message's identity, so the one duplicate the outbox can
// produce (a relay that stops between the broker's confirm and marking
// the row sent) is absorbed by the receiver's inbox.
//
// # Enqueue
//
// A handler writes its outgoing messages with the same pgx.Tx as its
// business writes ([Enqueue], [EnqueueBatch]). A rolled-back transaction
// publishes nothing.
//
//	inboxmq.HandleTx(routes, "payments", func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[Capture]) error {
//		if _, err := tx.Exec(ctx, `UPDATE accounts SET …`); err != nil {
//			return err
//		}
//		return outbox.Enqueue(ctx, tx, outbox.Message{
//			Exchange:       "payments",
//			RoutingKey:     "payment.captured",
//			IdempotencyKey: msg.Key + "/captured", // the id derives from it
//			OrderingKey:    "account-7",
//			ContentType:    "application/json",
//			Body:           body,
//		})
//	}, nil)
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
// # Publishing
//
// An inboxmq.Worker runs the relay unless inboxmq.Config.DisableRelay: it
// claims committed rows in batches, publishes them persistent and mandatory
// with publisher confirms, and marks them sent only after the broker's
// confirm. Several workers may run it against one table: each row is
// claimed by one relay at a time. A Worker wakes its own relay when a
// handler's transaction ends; a row enqueued elsewhere wakes the relays
// through a NOTIFY that PostgreSQL delivers on commit, and they also poll
// every second. A broker or database outage only delays rows. A message the
// broker nacks or cannot route (no queue bound, unless
// inboxmq.Config.DropUnroutable) is retried with backoff, from 1s doubling
// up to 5m, forever: watch outbox_oldest_pending_age_seconds. Sent rows are
// deleted after 24h, and while a row stays, enqueueing its id again is a
// no-op.
//
// A service that only enqueues (a web application) runs an inboxmq.Worker
// without routes, which consumes nothing and runs the relay; or it leaves
// the publishing to the workers that run against the same database.
//
// # Ordering
//
// Messages that share an ordering key (Message.OrderingKey) go out one at
// a time, in enqueue order, even across workers: each only after the
// previous one was confirmed, so a message that backs off holds its key's
// later messages back. "Enqueue order" is commit order when the
// transactions that write one aggregate serialise on it, as business
// writes to the same row do. Messages without a key are not held back.
//
// To keep that order up to the handlers, send an aggregate's messages to
// an ordered route (inboxmq.RouteOpts.Ordered): Exchange is the route's
// consistent-hash exchange, and RoutingKey and OrderingKey are both the
// aggregate's id. The routing key puts all of the aggregate's messages in
// one shard queue, the ordering key makes the relay publish them in
// order, and the route applies them in that order.
//
// # Backlog
//
// [ReadBacklog] counts the rows not yet published and the age of the
// oldest, the figures of the relay's gauges and of the operator console.
package outbox
