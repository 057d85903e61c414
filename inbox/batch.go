package inbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/inboxmq/inboxmq/inboxtype"
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
// With opts.GroupCommit set, the batch is sent inside the group's
// transaction, in the delivery's savepoint, as Handler sends a
// TxHandlerFunc's (a pipelined group commit carries it).
//
// BatchHandler panics if s or h is nil (a start-up bug).
func BatchHandler[T any](s *Store, h BatchHandlerFunc[T], opts *HandlerOpts) inboxtype.Handler[T] {
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
	return newHandler(s, inTx, h, opts)
}

// handleBatch is BatchHandler's one round trip for u: build queues the
// handler's writes (and leaves its result in u.pending); the claim, the
// writes and the result are sent as one batch, which PostgreSQL runs as
// one implicit transaction (no BEGIN: the batch's Sync commits it). The
// claim statement fails when the key is not free, and that aborts the
// writes after it. Anything but success ends on the per-message path,
// which settles the delivery from the key's row.
func (s *Store) handleBatch(u *unit, d *inboxtype.Delivery, build func(context.Context, *pgx.Batch) error) error {
	ctx := u.ctx

	// 1. The handler queues its writes; nothing is sent yet.
	wb := &pgx.Batch{}
	if err := runBuild(u, wb, build); err != nil {
		return s.handleOne(u) // the key's verdict first, then the handler's failure, recorded
	}

	// 2. The claim, the writes and the result: one round trip, one
	// transaction.
	var mid *string
	if u.messageID != "" {
		mid = &u.messageID
	}
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, wb.Len()+2)}
	b.Queue(s.sql.claimOrAbort, u.consumer, u.key, u.fp, mid, u.payload, u.attempt)
	b.QueuedQueries = append(b.QueuedQueries, wb.QueuedQueries...)
	if u.pending != nil {
		b.Queue(s.sql.setResult, u.consumer, u.key, string(u.pending))
	}
	cctx, span := startSpan(ctx, "inbox.batch")
	br := s.pool.SendBatch(cctx, b)
	var fence int64
	err := br.QueryRow().Scan(&fence)
	if err == nil {
		u.fence = fence
		processing(d, fence) // reported before the callbacks read the writes' results
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	endSpan(span, err)
	if err != nil {
		// 3. Nothing committed — or, the connection lost after the
		// commit, everything did: the per-message path settles which.
		return s.handleOne(u)
	}
	if d != nil {
		// A result set from a callback came after the stored one was
		// sent: the delivery keeps the stored one, which its duplicates
		// (and their replies) get too.
		d.Result = u.pending
	}
	return nil
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
