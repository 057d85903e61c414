package relay

import (
	"context"

	"github.com/inboxmq/inboxmq/internal/outboxwire"
)

// Wake wakes r as a NOTIFY on the outbox's channel would: one idle lane
// claims at once (or gathers first, while rows keep arriving). It never
// blocks, and does nothing but leave one wake-up pending while r is not
// running.
func (r *Relay) Wake() { notify(r.wake) }

// WakeLocally returns a context for one unit of work of this process (one
// delivery: its transaction, however many times it runs) whose outbox rows
// r relays. outbox.Enqueue, EnqueueBatch and AddToBatch called with that
// context (or one derived from it) leave out the NOTIFY that wakes relays
// through PostgreSQL — a signal, a message to every listening connection
// and a wake-up per transaction — and done wakes r instead, in-process.
// Call done once the work's transaction has ended, committed or not: rows
// that rolled back cost r one claim that finds nothing.
//
// Rows so enqueued reach a relay of another process only at its poll
// (Config.PollInterval), or with the next NOTIFY: the worker uses it for
// its handlers, whose rows its own relay publishes.
func (r *Relay) WakeLocally(ctx context.Context) (_ context.Context, done func()) {
	return outboxwire.WakeLocally(ctx, r.Wake)
}
