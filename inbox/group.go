package inbox

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Group commit (the gc of Handler, BatchHandler and ClaimHandler), layered on
// the steps of steps.go: deliveries handled concurrently share one
// transaction, one claim statement and one COMMIT, each delivery's
// handler in a savepoint of its own (a BatchHandler's group first tries
// one round trip: batch.go). Every way a batch can fail part-way ends on
// the per-message path for the deliveries concerned, so that each is
// decided alone.

// maxSavepoints is the most deliveries of a batch that share one
// transaction when each takes a savepoint: PostgreSQL keeps the ids of 64
// subtransactions of a transaction in memory (PGPROC_MAX_CACHED_SUBXIDS);
// past that, while the transaction runs, every snapshot on the server has
// to look transaction ids up in pg_subtrans (docs/performance.md).
const maxSavepoints = 64

// batcher collects deliveries handled concurrently into group commits. The
// first delivery of a batch leads it: it waits up to MaxWait for others (or
// until MaxBatch arrived) and for a free slot (MaxInFlight), then runs the
// batch; the others wait for their result. No goroutine outlives a call.
type batcher struct {
	s   *Store
	cfg GroupCommit
	sem chan struct{}

	mu  sync.Mutex
	cur *pendingBatch
}

type pendingBatch struct {
	units []*unit
	full  chan struct{}
}

func newBatcher(s *Store, cfg GroupCommit) *batcher {
	return &batcher{s: s, cfg: cfg, sem: make(chan struct{}, cfg.MaxInFlight)}
}

// do runs u in a batch and returns once u.err holds its verdict.
func (b *batcher) do(u *unit) {
	u.done = make(chan struct{})
	b.mu.Lock()
	pb := b.cur
	lead := pb == nil
	if lead {
		pb = &pendingBatch{full: make(chan struct{})}
		b.cur = pb
	}
	pb.units = append(pb.units, u)
	if len(pb.units) >= b.cfg.MaxBatch {
		b.cur = nil
		close(pb.full)
	}
	b.mu.Unlock()
	if !lead {
		<-u.done
		return
	}

	t := time.NewTimer(b.cfg.MaxWait)
	select {
	case <-t.C:
	case <-pb.full:
	}
	t.Stop()
	b.sem <- struct{}{}
	defer func() { <-b.sem }()
	b.mu.Lock()
	if b.cur == pb {
		b.cur = nil
	}
	units := pb.units
	b.mu.Unlock()
	b.s.execBatch(units)
}

// execBatch runs a batch. Deliveries of the same key within it are
// deferred to a following transaction, so they meet the first one's
// committed outcome exactly as a concurrent duplicate would.
func (s *Store) execBatch(units []*unit) {
	if len(units) == 1 {
		s.execGuarded(units) // a lone delivery: no key to defer
		return
	}
	for len(units) > 0 {
		var first, later []*unit
		seen := make(map[unitKey]struct{}, len(units))
		for _, u := range units {
			k := unitKey{u.namespace, u.key}
			if _, dup := seen[k]; dup {
				later = append(later, u)
				continue
			}
			seen[k] = struct{}{}
			first = append(first, u)
		}
		s.execGuarded(first)
		units = later
	}
}

// execGuarded runs execGroup and always releases the waiting callers: a
// panic outside the handlers (an observer, a span) fails the units instead
// of leaving the other deliveries of the batch blocked for ever. It cannot
// be left to the consumer's last guard: the batch runs on its leader's
// goroutine, and the others' callers wait on u.done.
func (s *Store) execGuarded(units []*unit) {
	defer func() {
		if p := recover(); p != nil {
			failAll(units, s.recovered(p, units[0], "batch"))
		}
		for _, u := range units {
			close(u.done)
		}
	}()
	s.execGroup(units)
}

// execOne runs one unit of a batch on the per-message path: its own
// transaction (for a claim's completion, Claim's own).
func (s *Store) execOne(u *unit) {
	if u.claim != nil {
		u.err = u.claim.completeAlone(u.ctx, u.run)
		return
	}
	if u.built != nil && s.sendBuilt(u.ctx, []*unit{u}) == nil {
		return
	}
	u.err = s.handleOne(u)
}

// execGroup runs units with distinct keys in one transaction (with
// savepoints, at most maxSavepoints of them; more run in several): BEGIN
// and the claim of every key, each claimed delivery's handler in a
// savepoint, COMMIT. A batch that fails part-way hands the deliveries
// concerned to the per-message path:
//   - a key whose values PostgreSQL refuses fails the batch's claim: each
//     delivery is claimed alone, so that only the bad one fails;
//   - a failure no savepoint could isolate reruns the batch without it;
//   - a failed COMMIT reruns each delivery alone (if that COMMIT did commit
//     after all, each is then a duplicate).
func (s *Store) execGroup(units []*unit) {
	if len(units) == 1 {
		s.execOne(units[0])
		return
	}
	ctx, done := batchContext(units)
	defer done()
	slices.SortFunc(units, func(a, b *unit) int {
		return cmp.Or(cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.key, b.key))
	})

	// BatchHandler's deliveries first try one round trip for the whole
	// group: every claim, with its result, and every write, as one
	// implicit transaction. Any failure runs the group as below.
	if takeBuilt(units) && s.sendBuilt(ctx, units) == nil {
		return
	}
	// Below, every delivery takes a savepoint. A larger batch commits in
	// transactions of maxSavepoints, in key order.
	if len(units) > maxSavepoints {
		for c := range slices.Chunk(units, maxSavepoints) {
			s.execGroup(c)
		}
		return
	}

	// A claim's completion is traced by Claim.Complete's own span.
	completions := units[0].claim != nil
	spans := make([]trace.Span, 0, len(units))
	if !completions {
		for _, u := range units {
			_, sp := startSpan(u.ctx, "inbox.claim")
			spans = append(spans, sp)
		}
	}
	tx, claimed, err := s.claimMany(ctx, units)
	for i, sp := range spans {
		endSpan(sp, cmp.Or(err, units[i].err))
	}
	switch {
	case err != nil && isPermanent(err):
		for _, u := range units {
			s.execOne(u)
		}
		return
	case err != nil:
		failAll(units, err)
		return
	}
	defer tx.rollback(context.WithoutCancel(ctx))
	if len(claimed) == 0 {
		return // every key was decided by the claim: nothing to commit
	}

	if i, herr := s.runSerial(ctx, tx, claimed); herr != nil {
		bad := claimed[i].u
		tx.rollback(context.WithoutCancel(ctx))
		s.recordFailure(bad, herr)
		if len(claimed) > 1 {
			// The others' work was rolled back with it: run them again
			// without it.
			s.execGroup(without(units, bad))
		}
		return
	}

	var commitSpans []trace.Span
	if !completions {
		for _, cu := range claimed {
			_, sp := startSpan(cu.u.ctx, "inbox.commit")
			commitSpans = append(commitSpans, sp)
		}
	}
	err = s.commitResults(ctx, tx, claimedUnits(claimed))
	for _, sp := range commitSpans {
		endSpan(sp, err)
	}
	if err == nil {
		return
	}
	if len(claimed) == 1 {
		claimed[0].u.err = err
		return
	}
	// One delivery's commit-time error (a deferred constraint, a
	// serialization failure at COMMIT) must not fail the others.
	for _, cu := range claimed {
		cu.u.err = nil
		s.execOne(cu.u)
	}
}

// runSerial runs the claimed units' handlers one after another on tx,
// each in a savepoint of its own when there are several: a handler's
// failure rolls back its own writes, and its row is marked failed in the
// batch's transaction. It returns the handler's error (u.err holds it
// mapped) and the index of the unit whose failure the transaction cannot
// survive: a lone handler's, or one whose first statement failed before
// its savepoint ran (a parse error, say) and aborted the transaction. The
// error is nil if the transaction can commit.
func (s *Store) runSerial(ctx context.Context, tx *lazyTx, claimed []claimedUnit) (int, error) {
	if len(claimed) == 1 {
		u := claimed[0].u
		u.fence = claimed[0].fence
		if herr := s.runHandler(u, tx); herr != nil {
			u.err = MapError(herr)
			return 0, herr
		}
		return 0, nil
	}
	for i, cu := range claimed {
		u := cu.u
		u.fence = cu.fence
		sp := &lazyTx{tx: tx, lead: leadSavepoint}
		herr := s.runHandler(u, sp)
		if herr == nil {
			continue
		}
		u.err = MapError(herr)
		var err error
		if sp.sent() {
			_, err = tx.Exec(ctx, rollbackToSQL)
		}
		if err == nil {
			_, err = tx.Exec(ctx, s.sql.failInTx, u.namespace, u.key, errorText(herr))
		}
		if err != nil {
			return i, herr
		}
	}
	return 0, nil
}

// without returns units without u, their verdicts reset for a new run.
func without(units []*unit, u *unit) []*unit {
	rest := make([]*unit, 0, len(units))
	for _, o := range units {
		if o != u {
			o.err = nil
			rest = append(rest, o)
		}
	}
	return rest
}

// batchContext governs the batch's own statements: it ends when every
// delivery's context has ended.
func batchContext(units []*unit) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(units[0].ctx))
	var left atomic.Int64
	left.Store(int64(len(units)))
	stops := make([]func() bool, len(units))
	for i, u := range units {
		stops[i] = context.AfterFunc(u.ctx, func() {
			if left.Add(-1) == 0 {
				cancel(context.Cause(u.ctx))
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel(nil)
	}
}

func failAll(units []*unit, err error) {
	for _, u := range units {
		if u.err == nil {
			u.err = err
		}
	}
}

// claimedUnits returns the units of claimed.
func claimedUnits(claimed []claimedUnit) []*unit {
	units := make([]*unit, len(claimed))
	for i, cu := range claimed {
		units[i] = cu.u
	}
	return units
}
