// Package relay is the outbox relay, the worker's machinery that
// publishes what package outbox enqueues: inboxmq.Worker builds one
// ([New]) unless Config.DisableRelay, starts it before the consumer and
// stops it after.
//
// # Batches
//
// A [Relay] claims pending rows in batches (Config.BatchSize, 100),
// publishes them persistent and mandatory on a confirm channel, and marks
// them sent in the same transaction only after the broker's confirm.
// Several relays may run at once, and each runs Config.Concurrency lanes
// (2), each with its own connection and confirm channel, so one lane
// publishes while another commits; a row is claimed by one batch at a
// time (FOR UPDATE SKIP LOCKED), so in normal operation each row goes
// out once. A relay that dies between the confirm and the mark leaves its
// rows pending: they go out again with the same message id, a duplicate
// the receiver's inbox absorbs.
//
// It wakes on LISTEN/NOTIFY and polls as a fallback (Config.PollInterval,
// 1s); the worker wakes it in-process for its handlers' rows
// ([Relay.WakeLocally]). A broker or database outage only delays rows: the
// relay reconnects with exponential backoff and the rows go out after it.
// A nacked or unroutable row backs off on its own (Config.RetryMinDelay,
// 1s, doubling up to 5m), and so does a row that cannot be published
// (headers that do not decode, or too large for a frame). The statements
// are in docs/internals.md.
//
// # Ordering
//
// Rows that share an ordering key go out one at a time: a row is claimed
// only when no earlier row of its key is unsent, so it is published after
// the previous one was confirmed, even across lanes and relays, and a
// row that backs off holds its key's later rows back. "Earlier" is id
// (insert) order, which is commit order when the transactions that write
// one aggregate serialise on it, as business writes to the same row do.
// Rows without a key are not held back by anything.
//
// # Retention
//
// Sent rows stay for Config.Retention (24h) and are then deleted in small
// batches (Config.RetentionBatchSize, 1000) every minute; while a row
// stays, re-enqueueing its id is a no-op.
//
// # Metrics
//
// Under the namespace inboxmq, on Config.Registerer:
// outbox_pending_rows, outbox_oldest_pending_age_seconds,
// outbox_published_total, outbox_publish_failed_total{reason} and the
// histogram outbox_relay_lag_seconds (row creation to confirm). Each batch
// is logged at debug level, failures at warn; the broker URL is logged
// without its password.
package relay
