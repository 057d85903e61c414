package inbox

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmq/inboxmq/inboxtype"
)

// This file is the per-message path of Handler: one delivery, one
// transaction, read top to bottom. The guarantee logic it sequences (the
// claim, the verdict on a key already taken, the failure record) lives in
// steps.go and is shared with group commit (group.go), which layers
// batching on top of the same steps.

// unit is one delivery on its way through the inbox. It lives for one
// Handle call and carries that call's context, like an http.Request does;
// in group commit it carries it to the batch's leader.
type unit struct {
	ctx       context.Context //nolint:containedctx // the caller's context, handed to the leader of its batch
	namespace string
	key       string
	messageID string
	attempt   int // the delivery's broker attempt (x-attempt), 1-based
	// sinceHeld is how long ago the delivery was last deferred because
	// another worker held a live claim on its key (0 if its last retry was
	// not that): the next such deferral is twice as long.
	sinceHeld time.Duration
	fp        []byte
	payload   []byte // nil unless the handler stores payloads
	run       func(ctx context.Context, tx pgx.Tx) error
	// fence is the fence of the unit's claim, set by the claim step
	// before run is called.
	fence int64
	// result is the result a completed key's row holds, read with the
	// verdict on a key that could not be claimed (a duplicate's).
	result []byte
	// pending is the result the handler left, written with the COMMIT
	// (commitResults), or by the claim of a BatchHandler's batch
	// (sendBuilt); nil when it left none or failed.
	pending []byte
	// built holds a BatchHandler's writes, queued before the claim, until
	// they are sent (sendBuilt); d is its delivery, whose fence and status
	// that path reports.
	built *pgx.Batch
	d     *inboxtype.Delivery
	// claim is set on the completion of a claim in claim mode's group
	// commit (ClaimHandler's gc): the batch's claim step is then the
	// fenced completion of its claims, and a unit whose claim was taken
	// over gets claim's verdict. A batch holds units of one handler, so
	// all of one kind.
	claim *Claim

	// err and done are group commit's hand-over of the verdict to the
	// unit's caller.
	err  error
	done chan struct{}
}

type unitKey struct{ consumer, key string }

// handleOne runs u in a transaction of its own: claim, handler, commit.
func (s *Store) handleOne(u *unit) error {
	ctx := u.ctx

	// 1. BEGIN and the claim of the key, in one round trip. A key that is
	// not free comes back as its verdict: a duplicate, a key conflict, or
	// a claim held by another worker.
	cctx, span := startSpan(ctx, "inbox.claim") // its statements nest under it
	tx, fence, err := s.claimOne(cctx, u)
	endSpan(span, err)
	if err != nil {
		return err
	}
	defer tx.rollback(context.WithoutCancel(ctx))

	// 2. The handler, in the claim's transaction. On failure its writes
	// and the claim roll back together, and the failed attempt is recorded
	// on the row in a statement of its own.
	u.fence = fence
	if herr := s.runHandler(u, tx); herr != nil {
		tx.rollback(context.WithoutCancel(ctx))
		s.recordFailure(u, herr)
		return MapError(herr)
	}

	// 3. COMMIT, in one round trip with the result the handler left: the
	// key is completed together with the handler's writes.
	cctx, span = startSpan(ctx, "inbox.commit")
	err = s.commitResults(cctx, tx, []*unit{u})
	endSpan(span, err)
	return err
}

// runHandler runs u's handler in tx, turning a panic into u's error. This
// recover cannot be left to the consumer's last guard: in group commit the
// handler runs on the leader's goroutine, for another delivery, and its
// panic must fail only its own savepoint. The per-message path shares it,
// so that a panic is recorded on the row the same way in every mode.
func (s *Store) runHandler(u *unit, tx pgx.Tx) (err error) {
	ctx, span := startSpan(u.ctx, "inbox.handler")
	defer func() {
		if p := recover(); p != nil {
			err = s.recovered(p, u, "handler")
		}
		endSpan(span, err)
	}()
	return u.run(ctx, tx)
}

const tracerName = "github.com/inboxmq/inboxmq/inbox"

// startSpan starts a child span of the caller's span; a no-op when ctx
// carries none (no global provider is consulted).
func startSpan(ctx context.Context, name string) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.SpanContext().IsValid() {
		return ctx, parent // no trace: nothing to record, nothing to allocate
	}
	return parent.TracerProvider().Tracer(tracerName).Start(ctx, name)
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
