package inbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/outboxwire"
)

// BatchHandlerFunc queues one message's writes in b instead of running
// them: [BatchHandler] sends them, with the claim of the message's key and
// its result, in one round trip. It runs before the key is claimed — for
// a duplicate too, whose writes are then never committed — so it must do
// nothing but build the batch: no reads, no calls out, no effect of its own.
//
// It may set the message's result (inboxtype.Message.SetResult) before it
// returns; a result set later, from a callback, is neither stored nor
// kept: the delivery carries the stored one, as its duplicates do. Callbacks
// set on the queued queries (pgx.QueuedQuery.Exec, Query, QueryRow) run
// as the results arrive, once PostgreSQL has run every statement of the
// batch: they may read what the statements return (a RETURNING id to log),
// but not decide whether the writes commit. A handler that must read
// before it writes, or decide from what it reads, is a [TxHandlerFunc].
type BatchHandlerFunc[T any] func(ctx context.Context, b *pgx.Batch, msg *inboxtype.Message[T]) error

// BatchHandler adapts h into a consumer handler with Handler's guarantees
// (the same claim, verdicts, failure records and crash-loop counter) in
// fewer round trips: the claim of the key, h's writes and the result
// travel to PostgreSQL together and run as one transaction, which the key
// aborts when it is not free. A delivery whose key is free and whose
// writes succeed costs one round trip.
//
// Any other outcome — a key already taken (a duplicate, a key conflict, a
// live claim), a write PostgreSQL refuses, h's own error, a lost
// connection — rolls the attempt back as a whole and settles the delivery
// on Handler's per-message path: the key is claimed first, h runs again and
// its batch is sent in the claim's transaction. The delivery then gets
// exactly Handler's verdict; if the connection was lost after the
// transaction committed, the key is found completed and the delivery is a
// duplicate of itself. Such deliveries cost the extra round trips of that
// path (docs/internals.md); a stream that is mostly duplicates is cheaper
// with Handler.
//
// With gc set, the deliveries of a group travel the same
// way together: every claim, with its result, and every write, in one
// round trip and one transaction, which commits whole or not at all. When
// it cannot commit whole (one key not free, one write refused, a lost
// answer), the group runs as Handler's group commit — h runs again, each
// batch is sent in its delivery's savepoint — so that each delivery gets
// its own verdict; a stream with many duplicates in a group pays that
// second attempt, and is cheaper with Handler.
//
// BatchHandler panics if s or h is nil (a start-up bug).
func BatchHandler[T any](s *Store, h BatchHandlerFunc[T], gc *GroupCommit) inboxtype.Handler[T] {
	if s == nil || h == nil {
		panic("inbox: BatchHandler needs a store and a handler")
	}
	inTx := func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[T]) error {
		b := &pgx.Batch{}
		if err := h(ctx, b, msg); err != nil {
			return err
		}
		if b.Len() == 0 {
			return nil
		}
		return tx.SendBatch(ctx, b).Close()
	}
	return newHandler(s, inTx, h, gc)
}

// handleBatch is BatchHandler's one round trip for u: build queues the
// handler's writes (and leaves its result in u.pending); the claim with the
// result, and the writes, are sent as one batch, which PostgreSQL runs as
// one implicit transaction (no BEGIN: the batch's Sync commits it). The
// claim statement fails when the key is not free, and that aborts the
// writes sent with it. Anything but success ends on the per-message path,
// which settles the delivery from the key's row.
func (s *Store) handleBatch(u *unit, build func(context.Context, *pgx.Batch) error) error {
	if !s.buildUnit(u, build) {
		return s.handleOne(u) // the key's verdict first, then the handler's failure, recorded
	}
	if err := s.sendBuilt(u.ctx, []*unit{u}); err != nil {
		// Nothing committed — or, the connection lost after the commit,
		// everything did: the per-message path settles which.
		return s.handleOne(u)
	}
	return nil
}

// buildUnit runs the handler's build for u: its writes go to u.built, its
// result to u.pending. It reports whether the handler succeeded; if not,
// u.built is nil and the delivery takes the per-message path.
func (s *Store) buildUnit(u *unit, build func(context.Context, *pgx.Batch) error) bool {
	wb := &pgx.Batch{}
	if err := runBuild(u, wb, build); err != nil {
		u.built, u.pending = nil, nil
		return false
	}
	u.built = wb
	return true
}

// sendBuilt sends the claims of units (distinct keys, sorted by (consumer,
// key), each with u.built) and then their writes, in that order, as one
// batch: one round trip, one implicit transaction. The claim — one
// statement for the whole group — writes each unit's result and raises
// unless it claimed every key, so the batch commits whole or not at all.
// Every unit's u.built is cleared: a failed attempt is not tried again.
// The units' outbox events (outbox.AddToBatch) go in one statement, where
// the first of them was (outboxwire.MergeInserts). On success each unit's fence is set and StatusProcessing reported before
// its writes' callbacks run, and its delivery keeps the result it stored.
func (s *Store) sendBuilt(ctx context.Context, units []*unit) error {
	n := 1
	for _, u := range units {
		n += u.built.Len()
	}
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, n)}
	if len(units) == 1 {
		u := units[0]
		b.Queue(s.sql.claimOrAbort, u.namespace, u.key, u.fp, messageIDArg(u), u.payload, u.attempt, resultArg(u)).QueryRow(func(row pgx.Row) error {
			if err := row.Scan(&u.fence); err != nil {
				return err
			}
			processing(u.d, u.fence) // reported before the callbacks read the writes' results
			return nil
		})
	} else {
		b.Queue(s.sql.claimAllOrAbort, claimArgs(units)...).QueryRow(func(row pgx.Row) error {
			var keys []string
			var fences []int64
			if err := row.Scan(&keys, &fences); err != nil {
				return err
			}
			for i, u := range units {
				if i >= len(keys) || len(fences) != len(keys) || keys[i] != u.key {
					return fmt.Errorf("inbox: group claim answered %d keys for %d deliveries, out of order", len(keys), len(units))
				}
			}
			for i, u := range units {
				u.fence = fences[i]
				processing(u.d, u.fence)
			}
			return nil
		})
	}
	for _, u := range units {
		b.QueuedQueries = append(b.QueuedQueries, u.built.QueuedQueries...)
		u.built = nil
	}
	b.QueuedQueries = outboxwire.MergeInserts(b.QueuedQueries)
	// A span per traced delivery; a lone delivery's statements nest
	// under its own.
	spans := make([]trace.Span, 0, len(units))
	for _, u := range units {
		if sctx, sp := startSpan(u.ctx, "inbox.batch"); sp.SpanContext().IsValid() {
			spans = append(spans, sp)
			if len(units) == 1 {
				ctx = sctx
			}
		}
	}
	err := s.pool.SendBatch(ctx, b).Close()
	for _, sp := range spans {
		endSpan(sp, err)
	}
	if err != nil {
		return err
	}
	for _, u := range units {
		if u.d != nil {
			// A result set from a callback came after the stored one was
			// sent: the delivery keeps the stored one, which its
			// duplicates (and their replies) get too.
			u.d.Result = u.pending
		}
	}
	return nil
}

// resultArg is u's pending result as a parameter: NULL when it has none.
func resultArg(u *unit) *string {
	if u.pending == nil {
		return nil
	}
	r := string(u.pending)
	return &r
}

// claimArgs are claimAllOrAbort's parameters for units, in their order:
// the group claim's, their results, and how many keys it must claim.
func claimArgs(units []*unit) []any {
	results := make([]*string, len(units))
	for i, u := range units {
		results[i] = resultArg(u)
	}
	return append(claimArrays(units), results, len(units))
}

// takeBuilt reports whether every unit of a group holds its built batch,
// and clears them all if not: the group then runs as Handler's.
func takeBuilt(units []*unit) bool {
	for _, u := range units {
		if u.built == nil {
			for _, o := range units {
				o.built = nil
			}
			return false
		}
	}
	return true
}

// runBuild runs build, turning a panic into an error. The panic is not
// logged here: the per-message path runs the handler again, and records
// and logs it there (runHandler).
func runBuild(u *unit, b *pgx.Batch, build func(context.Context, *pgx.Batch) error) (err error) {
	ctx, span := startSpan(u.ctx, "inbox.handler")
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("inbox: handler panicked: %v", p)
		}
		endSpan(span, err)
	}()
	return build(ctx, b)
}
