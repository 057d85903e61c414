package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// TxHandlerFunc handles one message inside the transaction that records
// it in the inbox. Every business write must go through tx, so that it
// commits together with the inbox row or not at all. It cannot commit or
// roll back tx: tx.Commit and tx.Rollback return an error and end nothing
// (it may open nested transactions with tx.Begin or pgx.BeginFunc: they
// are savepoints). tx is usable until h returns; every call after that
// fails with pgx.ErrTxClosed.
type TxHandlerFunc[T any] func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[T]) error

// Handler adapts h into a consumer handler that runs it exactly once per
// idempotency key (msg.Namespace, msg.Key): h's writes through tx commit
// together with the key's inbox row, or not at all. Per delivery:
//
//  1. a delivery that a classic queue redelivered (the previous worker
//     died or lost its connection before settling it) is counted on the
//     row first; past StoreConfig.CrashLimit such redeliveries it fails
//     permanently (reason crash_loop). Quorum queues (x-delivery-count
//     set) bound crash loops with their own delivery limit instead;
//  2. a transaction begins and claims the key; a row that is not completed
//     (received, failed or dead, or an expired claim of claim mode) is
//     taken up again;
//  3. the key is completed: h does not run, and the delivery is a duplicate
//     (an error matching [retry.ErrDuplicate]), or, if the message's
//     fingerprint (inboxtype.Message.Fingerprint) differs from the one
//     recorded, a key conflict (permanent); a live claim of claim mode asks
//     for a retry after its lease;
//  4. otherwise msg.Delivery.InboxFence is set, StatusProcessing reported,
//     and h runs with the transaction;
//  5. h returned nil: the transaction commits, and Handle returns nil only
//     once it has (the consumer acks after that); h failed: everything
//     rolls back, and the failed attempt (attempts, last_error,
//     last_failed_at) is recorded on the row. The row's attempts is the
//     delivery's broker attempt (msg.Attempt), not a count of handler runs:
//     see Record.Attempts.
//
// A concurrent duplicate waits on the inbox row's primary key until the
// first transaction commits (then it is a duplicate) or rolls back (then it
// proceeds). h's errors are mapped with [MapError]: transient database
// errors become retryable with a reason, a value or constraint PostgreSQL
// refuses (classes 22 and 23) permanent, a unique violation on a business
// table a duplicate; h's own retry errors pass through. An empty key is
// permanent, and so is a key PostgreSQL cannot store (a NUL byte): in a
// batch, such a key fails alone.
//
// With gc set, deliveries handled concurrently share one transaction: each
// in its own savepoint (a failure rolls back only its own writes), all
// committed together; handlers share the batch's connection (see the
// package documentation's Group commit for what a handler may assume). A
// nil gc means one transaction per delivery. A failed COMMIT (a deferred
// constraint, a serialization failure) runs the batch's deliveries again
// one by one, each in its own transaction, so that only the delivery whose
// writes fail at COMMIT fails (classified by MapError: a deferred foreign
// key is permanent); their handlers then run twice, the first run rolled
// back. The statements are described in docs/internals.md.
//
// Handler panics if s or h is nil (a start-up bug).
func Handler[T any](s *Store, h TxHandlerFunc[T], gc *GroupCommit) inboxtype.Handler[T] {
	if s == nil || h == nil {
		panic("inbox: Handler needs a store and a handler")
	}
	return newHandler(s, h, nil, gc)
}

// newHandler is the body of Handler and BatchHandler: h runs in the
// transaction of the per-message path or of a group commit; build, when
// set, first tries BatchHandler's one round trip (handleBatch).
func newHandler[T any](s *Store, h TxHandlerFunc[T], build BatchHandlerFunc[T], gc *GroupCommit) inboxtype.Handler[T] {
	var b *batcher
	if gc != nil {
		if err := gc.validate(); err != nil {
			panic(err)
		}
		b = newBatcher(s, gc.withDefaults())
	}
	return inboxtype.HandlerFunc[T](func(ctx context.Context, msg *inboxtype.Message[T]) (err error) {
		defer func() { s.healPartitions(ctx, err) }()
		u, err := s.newUnit(ctx, msg.Namespace, msg.Key, msg.ID, msg.Attempt, msg.Delivery, msg.Fingerprint(), false)
		if err != nil {
			return err
		}
		takeResult(msg.Delivery) // left by an earlier run of this delivery
		if crashCounted(msg.Redelivered, msg.Delivery) {
			if err := s.countRedelivery(ctx, u); err != nil {
				return err
			}
		}
		u.run = func(ctx context.Context, tx pgx.Tx) error {
			u.pending = nil
			processing(msg.Delivery, u.fence)
			takeResult(msg.Delivery) // a result set by an earlier, failed run
			if err := h(ctx, tx, msg); err != nil {
				return err
			}
			return s.deferResult(u, msg.Result())
		}
		var buildUnit func(context.Context, *pgx.Batch) error
		if build != nil {
			u.d = msg.Delivery
			buildUnit = func(ctx context.Context, wb *pgx.Batch) error {
				takeResult(msg.Delivery)
				if err := build(ctx, wb, msg); err != nil {
					return err
				}
				return s.deferResult(u, msg.Result())
			}
		}
		switch {
		case b != nil:
			if build != nil {
				s.buildUnit(u, buildUnit) // a failed build runs in the group's savepoint path
			}
			b.do(u)
		case build != nil:
			u.err = s.handleBatch(u, buildUnit)
		default:
			u.err = s.handleOne(u)
		}
		keepResult(msg.Delivery, u.pending, u.result, u.err)
		return u.err
	})
}

func (s *Store) newUnit(ctx context.Context, namespace, key, messageID string, attempt int, d *inboxtype.Delivery, fp []byte, storePayload bool) (*unit, error) {
	if err := s.ready(); err != nil {
		return nil, retry.WithReason(retry.ReasonError, retry.Retryable(err))
	}
	if key == "" {
		return nil, retry.Permanent(retry.WithReason(retry.ReasonInvalid, errors.New("inbox: empty idempotency key")))
	}
	if namespace == "" {
		return nil, retry.Permanent(retry.WithReason(retry.ReasonInvalid, errors.New("inbox: empty namespace")))
	}
	u := &unit{ctx: ctx, namespace: namespace, key: key, messageID: messageID, attempt: max(attempt, 1), fp: fp}
	if d != nil {
		u.sinceHeld = d.SinceDeferred(ReasonClaimHeld, time.Now())
		if storePayload {
			u.payload = d.Body
		}
	}
	return u, nil
}

// processing records on d the fence of the key's claim and reports
// StatusProcessing: the key is claimed and the handler is about to run. A
// message built without a delivery (d nil) has nothing to record. The
// handler adapters call it, so that the batch code never touches a
// delivery.
func processing(d *inboxtype.Delivery, fence int64) {
	if d == nil {
		return
	}
	d.InboxFence = fence
	d.Transition(inboxtype.StatusProcessing, nil)
}

// crashCounted reports whether a delivery pays for the crash-loop counter:
// only redelivered ones, and not those of quorum queues (x-delivery-count
// set), whose delivery limit the broker enforces itself.
func crashCounted(redelivered bool, d *inboxtype.Delivery) bool {
	return redelivered && (d == nil || d.DeliveryCount == 0)
}

// countRedelivery is the crash-loop bound: one autocommit statement, only
// for deliveries the broker redelivered.
func (s *Store) countRedelivery(ctx context.Context, u *unit) error {
	if s.cfg.CrashLimit < 0 {
		return nil
	}
	var mid *string
	if u.messageID != "" {
		mid = &u.messageID
	}
	var status string
	var deliveries int
	err := s.pool.QueryRow(ctx, s.sql.redelivered, u.namespace, u.key, mid, s.cfg.CrashLimit).Scan(&status, &deliveries)
	if err != nil {
		return infraError(ReasonDBConnection, fmt.Errorf("inbox: count redelivery: %w", err))
	}
	if status != RecordCompleted && deliveries > s.cfg.CrashLimit {
		return retry.Permanent(retry.WithReason(ReasonCrashLoop, fmt.Errorf(
			"inbox: key %q of namespace %q was redelivered %d times (crash limit %d)", u.key, u.namespace, deliveries, s.cfg.CrashLimit)))
	}
	return nil
}
