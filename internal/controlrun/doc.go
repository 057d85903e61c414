// Package controlrun is the worker's side of the runtime controls: it
// obeys the switches that an operator stores through package control.
//
//   - [Watcher] keeps the controls in memory (LISTEN on
//     control.Channel, with polling as the fallback), drives a [Target]
//     (the consumer) with pause, resume and concurrency changes, and
//     answers the Block middleware from memory.
//   - [Parker] and [DialParker] park a blocked delivery: a copy, with
//     publisher confirms, to its queue's parked queue, before the
//     consumer acks the original. control.Release moves it back.
//   - [Heartbeat] writes the worker's presence row, which
//     control.Store.Workers reads.
//   - [BreakerReporter] publishes the worker's circuit breakers' states,
//     which control.Store.Breakers reads.
//
// The inboxmq worker builds and runs all of them (the watcher and the
// parker unless its controls are disabled); nothing here has a user
// outside the project. Pickup times, tables and the parked queue are
// described in docs/operations.md.
package controlrun
