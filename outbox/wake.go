package outbox

import (
	"context"
	"sync/atomic"
)

// Wake wakes r as a NOTIFY on NotifyChannel would: one idle lane claims at
// once (or gathers first, while rows keep arriving). It never blocks, and
// does nothing but leave one wake-up pending while r is not running.
func (r *Relay) Wake() { notify(r.wake) }

// WakeLocally returns a context for one unit of work of this process (one
// delivery: its transaction, however many times it runs) whose outbox rows
// r relays. Enqueue, EnqueueBatch and AddToBatch called with that context
// (or one derived from it) leave out the NOTIFY that wakes relays through
// PostgreSQL — a signal, a message to every listening connection and a
// wake-up per transaction — and done wakes r instead, in-process. Call done
// once the work's transaction has ended, committed or not: rows that
// rolled back cost r one claim that finds nothing.
//
// Rows so enqueued reach a relay of another process only at its poll
// (RelayConfig.PollInterval), or with the next NOTIFY, so use it where r
// runs in the process that enqueues (inboxmq.Worker does, for its
// handlers) and keep plain Enqueue where the relay runs elsewhere.
func (r *Relay) WakeLocally(ctx context.Context) (_ context.Context, done func()) {
	lw := &localWake{relay: r}
	return context.WithValue(ctx, localWakeKey{}, lw), lw.done
}

type localWakeKey struct{}

// localWake is WakeLocally's record of one unit of work.
type localWake struct {
	relay  *Relay
	queued atomic.Bool // rows were enqueued: done wakes the relay
}

func (lw *localWake) done() {
	if lw.queued.Load() {
		lw.relay.Wake()
	}
}

// wakesLocally reports whether ctx comes from WakeLocally, and records
// that rows are enqueued under it.
func wakesLocally(ctx context.Context) bool {
	lw, _ := ctx.Value(localWakeKey{}).(*localWake)
	if lw == nil {
		return false
	}
	lw.queued.Store(true)
	return true
}
