// Package control is the operator's API to inboxmq's runtime controls:
// switches stored in PostgreSQL that every running worker obeys without a
// deploy — pause a namespace, lower its concurrency, block an idempotency
// key (or a key prefix) at ingress — and what the workers publish back:
// which of them are running and obey ([Store.Workers]) and the state of
// their circuit breakers ([Store.Breakers]).
//
// inboxctl and the operator console are built on it; a deploy script or an
// incident tool can use it the same way.
//
//	s := control.NewStore(pool)
//	err := s.Pause(ctx, "payments", &control.ChangeOpts{By: "alice", Reason: "gateway outage"})
//	…
//	err = s.Resume(ctx, "payments", nil)
//
// # Stored switches
//
// A [Store] writes the tables inboxmq_controls and inboxmq_blocks (created
// by the migrations) and, in the same statement, sends NOTIFY on
// [Channel], so the change is announced exactly when it commits; inside a
// transaction (a [DB] may be a pgx.Tx) the change and its notification
// commit together. Writing a switch is all a caller does: the workers
// apply it.
//
// # Pickup time
//
// Every inboxmq worker (unless its Config.DisableControls is set) listens on
// [Channel] and reloads the controls on each notification, and polls
// every second as the fallback. A change reaches the running workers
// within milliseconds, and within 2 seconds at worst. A worker that starts
// later applies the stored state before it takes a delivery.
//
// # Pause and concurrency
//
// [Store.Pause] stops a namespace's delivery loop on every worker: in-flight
// work finishes and unacked deliveries stay in the queue. [Store.Resume]
// undoes it. [Store.SetConcurrency] limits a namespace's concurrent
// deliveries per worker process; 0 restores its configured concurrency.
//
// # Blocked keys and the parked queue
//
// [Store.Block] makes the workers park every delivery of a namespace whose
// key is blocked: the message is copied, with publisher confirms, to
// "<queue>.parked" ([inboxtype.ParkedQueue], with the headers
// [inboxtype.HeaderParkedReason], [inboxtype.HeaderParkedPattern] and
// [inboxtype.HeaderParkedAt]) and only then acked, so it is neither
// processed nor lost. [Store.Unblock] removes the block, and
// [Release] moves parked messages back to the work queue, where the inbox
// processes each exactly once. Unblock first: a message released while its
// key is still blocked is parked again.
//
// # Who obeys
//
// A change is obeyed only by the running workers that serve its namespace
// with their controls on. Each worker announces itself in the table
// inboxmq_workers (its namespaces, version and whether its controls are
// on), refreshed every 5 seconds and marked stopped on a graceful stop;
// [Store.Workers] reads the rows as live, stale or stopped, so that a tool
// can say how many live workers obey a change.
package control
