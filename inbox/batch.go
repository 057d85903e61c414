package inbox

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmq/inboxmq/retry"
)

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

// unit is one delivery on its way through a (group) commit. It lives for
// one Handle call and carries that call's context to the batch's leader,
// like an http.Request does.
type unit struct {
	ctx       context.Context //nolint:containedctx // the caller's context, handed to the leader of its batch
	consumer  string
	key       string
	messageID string
	attempt   int // the delivery's broker attempt (x-attempt), 1-based
	fp        []byte
	payload   []byte // nil unless the handler stores payloads
	run       func(ctx context.Context, tx pgx.Tx) error
	// fence is the fence of the unit's claim, set by the claim step
	// before run is called.
	fence int64
	// claim is set on the completion of a claim in claim mode's group
	// commit (ClaimOpts.GroupCommit): the batch's claim step is then the
	// fenced completion of its claims, and a unit whose claim was taken
	// over gets claim's verdict. A batch holds units of one handler, so
	// all of one kind.
	claim *Claim

	err  error
	done chan struct{}
}

type unitKey struct{ consumer, key string }

// execBatch runs units: the batch of one (per-message mode) and group
// commit share it. Deliveries of the same key within the batch are deferred
// to a following transaction, so they meet the first one's committed
// outcome exactly as a concurrent duplicate would.
func (s *Store) execBatch(units []*unit, pipeline bool) {
	for len(units) > 0 {
		var first, later []*unit
		if len(units) == 1 {
			first = units
		} else {
			seen := make(map[unitKey]struct{}, len(units))
			for _, u := range units {
				k := unitKey{u.consumer, u.key}
				if _, dup := seen[k]; dup {
					later = append(later, u)
					continue
				}
				seen[k] = struct{}{}
				first = append(first, u)
			}
		}
		s.execGuarded(first, pipeline)
		units = later
	}
}

// execGuarded runs execDistinct and always releases the waiting callers: a
// panic outside the handlers (an observer, a span) fails the units instead
// of leaving the other deliveries of the batch blocked for ever. It cannot
// be left to the consumer's last guard: the batch runs on its leader's
// goroutine, and the others' callers wait on u.done.
func (s *Store) execGuarded(units []*unit, pipeline bool) {
	defer func() {
		if p := recover(); p != nil {
			failAll(units, s.recovered(p, units[0], "batch"))
		}
		for _, u := range units {
			close(u.done)
		}
	}()
	s.execDistinct(units, pipeline)
}

// batchContext governs the batch's own statements: it ends when every
// delivery's context has ended (a single caller's context otherwise).
func batchContext(units []*unit) (context.Context, func()) {
	if len(units) == 1 {
		return units[0].ctx, func() {}
	}
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

// execDistinct runs one transaction for units with distinct keys. Round
// trips: BEGIN pipelined with one claim statement, then per delivery its handler's
// statements (when more than one delivery was claimed, each in a SAVEPOINT
// pipelined with its first Exec; a failure adds ROLLBACK TO SAVEPOINT and
// the failure record), and one COMMIT.
//
// With pipeline (GroupCommit.Pipeline) and more than one delivery claimed,
// the handlers first run concurrently with their statements sent together
// (pipeline.go); if that attempt fails, the transaction is rolled back and
// the batch runs again here without pipeline.
func (s *Store) execDistinct(units []*unit, pipeline bool) {
	if len(units) == 1 && units[0].claim != nil {
		// A claim's completion alone takes claim mode's own path: BEGIN,
		// the fenced completion and the first statement in one round trip.
		u := units[0]
		u.err = u.claim.completeAlone(u.ctx, u.run)
		return
	}
	ctx, done := batchContext(units)
	defer done()
	slices.SortFunc(units, func(a, b *unit) int {
		return cmp.Or(cmp.Compare(a.consumer, b.consumer), cmp.Compare(a.key, b.key))
	})

	// A claim's completion is traced by Claim.Complete's own span.
	completions := units[0].claim != nil
	spans := make([]trace.Span, len(units))
	for i, u := range units {
		if !completions {
			_, spans[i] = startSpan(u.ctx, "inbox.claim")
		}
	}
	endSpans := func(err error) {
		for i, sp := range spans {
			if sp != nil {
				endSpan(sp, cmp.Or(err, units[i].err))
				spans[i] = nil
			}
		}
	}

	// BEGIN and the claim travel in one pipeline.
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	s.queueClaim(b, units)
	br := s.pool.SendBatch(ctx, b)
	tx := br.Tx()
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	claimed, err := s.claimBatch(ctx, tx, br, units)
	endSpans(err)
	if err != nil && len(units) > 1 && isPermanent(err) {
		// One key's values cannot be stored (a NUL byte, say): the claim
		// of all of them failed with it. Claim each in a transaction of its
		// own, so that only the bad one fails.
		_ = tx.Rollback(context.WithoutCancel(ctx))
		for _, u := range units {
			s.execDistinct([]*unit{u}, false)
		}
		return
	}
	if err != nil {
		failAll(units, err)
		return
	}
	if len(claimed) == 0 {
		return
	}

	var ok []*unit
	serial := claimed
	if pipeline && len(claimed) > 1 {
		if !s.runPipelined(ctx, tx, claimed) {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			for _, u := range units {
				u.err = nil
			}
			s.execDistinct(units, false)
			return
		}
		for _, cu := range claimed {
			ok = append(ok, cu.u)
		}
		serial = nil // every handler has run
	}
	savepoints := len(claimed) > 1
	for _, cu := range serial {
		u := cu.u
		u.fence = cu.fence
		if !savepoints {
			// The batch of one: on failure roll the whole transaction back,
			// then record the failed attempt on its own.
			if herr := s.runHandler(u, tx); herr != nil {
				u.err = MapError(herr)
				_ = tx.Rollback(context.WithoutCancel(ctx))
				s.recordFailure(u, herr)
				return
			}
			ok = append(ok, u)
			continue
		}
		sp := &lazySavepoint{Tx: tx}
		herr := s.runHandler(u, sp)
		if herr == nil {
			ok = append(ok, u)
			continue
		}
		u.err = MapError(herr)
		var err error
		if sp.sent {
			_, err = tx.Exec(ctx, rollbackToSQL)
		}
		if err == nil {
			_, err = tx.Exec(ctx, s.sql.failInTx, u.consumer, u.key, errorText(herr))
		}
		if err != nil {
			// This delivery's failure could not be isolated (its first
			// statement failed before its SAVEPOINT ran, such as a parse
			// error, and aborted the transaction): roll everything back,
			// record its failure on its own, and run the others again
			// without it, so one bad message does not fail its batch.
			_ = tx.Rollback(context.WithoutCancel(ctx))
			s.recordFailure(u, herr)
			rest := make([]*unit, 0, len(units)-1)
			for _, o := range units {
				if o != u {
					o.err = nil
					rest = append(rest, o)
				}
			}
			if len(rest) > 0 {
				s.execDistinct(rest, false)
			}
			return
		}
	}

	var commitSpans []trace.Span
	if !completions {
		commitSpans = make([]trace.Span, len(claimed))
		for i, cu := range claimed {
			_, commitSpans[i] = startSpan(cu.u.ctx, "inbox.commit")
		}
	}
	err = tx.Commit(ctx)
	if err != nil {
		err = infraError(ReasonDBCommit, fmt.Errorf("inbox: commit: %w", err))
	}
	for _, sp := range commitSpans {
		endSpan(sp, err)
	}
	if err != nil && len(claimed) > 1 {
		// One delivery's commit-time error (a deferred constraint, a
		// serialization failure at COMMIT) must not fail the others: run
		// the claimed deliveries again one by one, each in a transaction
		// of its own, where the inbox decides each as in per-message mode.
		// If the failed COMMIT did commit after all (its answer lost with
		// the connection), every key is completed and each is a duplicate.
		for _, cu := range claimed {
			cu.u.err = nil
			s.execDistinct([]*unit{cu.u}, false)
		}
		return
	}
	if err != nil {
		failAll(ok, err)
	}
}

type claimedUnit struct {
	u     *unit
	fence int64
}

// queueClaim queues the claim of units' keys: one statement for all. For
// the completions of claim mode it queues their fenced completion instead
// (queueCompletion).
func (s *Store) queueClaim(b *pgx.Batch, units []*unit) {
	if units[0].claim != nil {
		s.queueCompletion(b, units)
		return
	}
	if len(units) == 1 {
		u := units[0]
		var mid *string
		if u.messageID != "" {
			mid = &u.messageID
		}
		b.Queue(s.sql.claimOne, u.consumer, u.key, u.fp, mid, u.payload, u.attempt)
		return
	}
	n := len(units)
	consumers := make([]string, n)
	keys := make([]string, n)
	fps := make([][]byte, n)
	mids := make([]*string, n)
	payloads := make([][]byte, n)
	attempts := make([]int32, n)
	for i, u := range units {
		consumers[i], keys[i], fps[i], payloads[i] = u.consumer, u.key, u.fp, u.payload
		attempts[i] = int32(min(u.attempt, math.MaxInt32)) //nolint:gosec // bounded above
		if u.messageID != "" {
			mids[i] = &u.messageID
		}
	}
	b.Queue(s.sql.claim, consumers, keys, fps, mids, payloads, attempts)
}

// queueCompletion queues the fenced completion of the claims of units,
// in one statement. It marks them completed in the batch's transaction
// before their handlers run: a handler that fails is rolled back to its
// savepoint and its row marked failed (failInTx), which releases the claim.
func (s *Store) queueCompletion(b *pgx.Batch, units []*unit) {
	if len(units) == 1 {
		c := units[0].claim
		b.Queue(s.sql.completeOne, c.Consumer, c.Key, c.Token, c.Fence)
		return
	}
	n := len(units)
	consumers, keys, owners, fences := make([]string, n), make([]string, n), make([]string, n), make([]int64, n)
	for i, u := range units {
		consumers[i], keys[i], owners[i], fences[i] = u.claim.Consumer, u.claim.Key, u.claim.Token, u.claim.Fence
	}
	b.Queue(s.sql.completeMany, consumers, keys, owners, fences)
}

// claimBatch reads the results of BEGIN and the claim from br and closes
// it. Units whose key is not claimed get their verdict (duplicate, key
// conflict, claim held) in u.err.
func (s *Store) claimBatch(ctx context.Context, tx pgx.Tx, br pgx.BatchResults, units []*unit) ([]claimedUnit, error) {
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, infraError(ReasonDBConnection, fmt.Errorf("inbox: begin: %w", err))
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, infraError(ReasonDBConnection, fmt.Errorf("inbox: claim: %w", err))
	}
	if len(units) == 1 {
		return s.claimedOne(ctx, tx, br, rows, units[0])
	}
	fences := make(map[unitKey]int64, len(units))
	var k unitKey
	var fence int64
	_, err = pgx.ForEachRow(rows, []any{&k.consumer, &k.key, &fence}, func() error {
		fences[k] = fence
		return nil
	})
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, infraError(ReasonDBConnection, fmt.Errorf("inbox: claim: %w", err))
	}
	claimed := make([]claimedUnit, 0, len(fences))
	var missing []*unit
	for _, u := range units {
		if f, ok := fences[unitKey{u.consumer, u.key}]; ok {
			claimed = append(claimed, claimedUnit{u: u, fence: f})
		} else {
			missing = append(missing, u)
		}
	}
	if len(missing) > 0 {
		if err := s.explainUnclaimed(ctx, tx, missing); err != nil {
			return nil, err
		}
	}
	return claimed, nil
}

// claimedOne reads claimOne's answer (the fence, or no row) for the batch
// of one, and closes br.
func (s *Store) claimedOne(ctx context.Context, tx pgx.Tx, br pgx.BatchResults, rows pgx.Rows, u *unit) ([]claimedUnit, error) {
	var fence int64
	found := rows.Next()
	if found {
		if err := rows.Scan(&fence); err != nil {
			rows.Close()
			_ = br.Close()
			return nil, infraError(ReasonDBConnection, fmt.Errorf("inbox: claim: %w", err))
		}
	}
	rows.Close()
	err := rows.Err()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, infraError(ReasonDBConnection, fmt.Errorf("inbox: claim: %w", err))
	}
	if found {
		return []claimedUnit{{u: u, fence: fence}}, nil
	}
	if err := s.explainUnclaimed(ctx, tx, []*unit{u}); err != nil {
		return nil, err
	}
	return nil, nil
}

// explainUnclaimed sets the verdict of units whose key was not claimed.
func (s *Store) explainUnclaimed(ctx context.Context, tx pgx.Tx, units []*unit) error {
	consumers := make([]string, len(units))
	keys := make([]string, len(units))
	for i, u := range units {
		consumers[i], keys[i] = u.consumer, u.key
	}
	rows, err := tx.Query(ctx, s.sql.lookup, consumers, keys)
	if err != nil {
		return infraError(ReasonDBConnection, fmt.Errorf("inbox: look up duplicates: %w", err))
	}
	type state struct {
		status string
		fp     []byte
		lease  float64
	}
	found := make(map[unitKey]state, len(units))
	var k unitKey
	var st state
	var lease *float64
	_, err = pgx.ForEachRow(rows, []any{&k.consumer, &k.key, &st.status, &st.fp, &lease}, func() error {
		st.lease = 0
		if lease != nil {
			st.lease = *lease
		}
		found[k] = st
		return nil
	})
	if err != nil {
		return infraError(ReasonDBConnection, fmt.Errorf("inbox: look up duplicates: %w", err))
	}
	for _, u := range units {
		st, ok := found[unitKey{u.consumer, u.key}]
		u.err = verdict(u, st.status, st.fp, time.Duration(st.lease*float64(time.Second)), ok)
	}
	return nil
}

// verdict explains why a key could not be claimed, or, for a claim's
// completion, why the claim was no longer its owner's.
func verdict(u *unit, status string, fp []byte, lease time.Duration, found bool) error {
	if u.claim != nil {
		return u.claim.lostVerdict(status)
	}
	switch {
	case found && status == RecordCompleted && fp != nil && u.fp != nil && !bytes.Equal(fp, u.fp):
		return retry.Permanent(fmt.Errorf("inbox: key %q of consumer %q: %w", u.key, u.consumer, retry.ErrKeyConflict))
	case found && status == RecordCompleted:
		return retry.Duplicate(retry.SourceInbox, fmt.Errorf("inbox: key %q of consumer %q is completed", u.key, u.consumer))
	case found && status == RecordProcessing:
		return retry.WithReason(ReasonClaimHeld, retry.Defer(max(lease, time.Second),
			fmt.Errorf("inbox: key %q of consumer %q is claimed by another worker", u.key, u.consumer)))
	default:
		// The row changed between the claim and the look-up (such as a
		// retention delete): try again.
		return retry.WithReason(ReasonClaimHeld, retry.Retryable(
			fmt.Errorf("inbox: key %q of consumer %q could not be claimed (status %q)", u.key, u.consumer, status)))
	}
}

// runHandler runs u's handler in tx, turning a panic into u's error. This
// recover cannot be left to the consumer's last guard: in group commit the
// handler runs on the leader's goroutine, for another delivery, and its
// panic must fail only its own savepoint; pipelined, it runs on a goroutine
// of its own.
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

// recordFailure records a failed attempt after its transaction rolled
// back, so that the row shows the history. Errors are logged only: the
// delivery's own error is what matters to the consumer. A claim's
// completion records nothing here: its row is still its owner's claim,
// which ClaimHandler releases with the error.
func (s *Store) recordFailure(u *unit, herr error) {
	if u.claim != nil {
		return
	}
	ctx, cancel := s.cleanupCtx(u.ctx)
	defer cancel()
	var mid *string
	if u.messageID != "" {
		mid = &u.messageID
	}
	if _, err := s.pool.Exec(ctx, s.sql.failAuto, u.consumer, u.key, u.fp, mid, errorText(herr), u.attempt); err != nil {
		s.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "inbox: record failed attempt",
			slog.String("consumer", u.consumer), slog.String("key", u.key), slog.Any("error", err))
	}
}

// errorText bounds the stored error text.
func errorText(err error) string { return boundText(err.Error()) }

// boundText cuts s to the length stored as last_error.
func boundText(s string) string {
	const limit = 2000
	if len(s) > limit {
		s = s[:limit]
	}
	return s
}

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

func (b *batcher) do(u *unit) {
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
	b.s.execBatch(units, b.cfg.Pipeline)
}
