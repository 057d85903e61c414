// Package control holds inboxmq's runtime controls: the switches an
// operator flips on a running fleet without a deploy — pause a consumer,
// lower its concurrency, block an idempotency key (or a key prefix) at
// ingress.
//
// # Why a package of its own
//
// The controls are stored in PostgreSQL (tables inboxmq_controls and
// inboxmq_blocks, created by the migrations) because PostgreSQL is already
// the source of truth every worker can reach, and it can announce changes
// (NOTIFY). They belong neither to the consumer (which knows nothing of
// PostgreSQL) nor to the inbox (which records messages, not operator
// intent). The writer is [Store] (used by inboxctl); the reader is
// [Watcher], which every worker runs next to its consumer.
//
// # Pickup time
//
// Each [Store] write sends NOTIFY on [Channel] in the same statement. A
// [Watcher] holds one connection in LISTEN and reloads its snapshot on every
// notification, so a change reaches running workers within milliseconds.
// It also reloads every PollInterval (1s by default), which is the fallback
// when LISTEN is unavailable (a transaction-pooling proxy) or a
// notification is lost: the documented bound is 2s.
//
// # Pause and concurrency
//
// The watcher drives a [Target] — *consumer.Consumer satisfies it — with
// Pause, Resume and SetConcurrency (0 restores the configured value). A
// consumer paused before the worker starts is paused by Watcher.Start.
//
//	w, err := control.NewWatcher(pool, &control.WatcherConfig{
//		Target: c,                        // *consumer.Consumer
//		Queues: control.QueuesOf(router), // consumer name -> queue
//	})
//	if err := w.Start(ctx); err != nil { … }
//	defer w.Stop(context.Background())
//
// # Blocked keys and the parked queue
//
// [Watcher.Blocked] answers from memory, so checking each delivery does not
// query the database. middleware.Block parks a blocked delivery: a
// [Parker] republishes it, with confirm, to "<queue>.parked"
// ([ParkedQueueName]), and the consumer then acks the original. [Release]
// (inboxctl unblock) moves parked messages back to the work queue, where
// the inbox processes each exactly once.
//
// # Worker presence
//
// A change is obeyed only by the running workers that serve its consumer
// with a Watcher. Each worker process announces itself with a [Heartbeat]
// (table inboxmq_workers: its namespaces, version and whether its controls
// are on), refreshed every 5 seconds and marked stopped on a graceful
// stop; [Store.Workers] reads the rows as live, stale or stopped, so that
// inboxctl and the console say how many live workers obey a change. The
// inboxmq worker runs both the watcher (unless its controls are disabled)
// and the heartbeat (always).
package control
