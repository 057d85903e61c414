// Package ops holds the operator's operations that inboxctl and the web
// console (package ui) both perform: inbox statistics and searches, reading
// dead letters without losing them, purging a queue, removing a block and
// releasing its parked messages, the broker depths of a route's queues,
// and who a change of the controls reaches (the live workers that obey it,
// from their presence rows).
// Each query or broker operation lives here once; the commands and the
// console only present the results.
//
// Operations that already have a public home are not wrapped: the controls
// are control.Store's, the reconcile pass is inbox.Reconciler's, the replay
// is consumer.ReplayDLQ's and one row is inbox.Store.Get's.
package ops
