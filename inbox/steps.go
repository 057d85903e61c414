package inbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxmq/inboxmq/retry"
)

// The inbox's guarantee logic, one small function per step: claim a key
// (one or many), explain a key that could not be claimed, record a failed
// attempt. The per-message path (handle.go) and group commit (group.go)
// sequence the same steps; docs/internals.md gives their statements.

// claimOne sends BEGIN and the claim of u's key in one round trip. It
// returns the open transaction and the claim's fence; if the key is not
// free, the transaction is rolled back and the error is the key's verdict
// (see verdict).
func (s *Store) claimOne(ctx context.Context, u *unit) (*lazyTx, int64, error) {
	var mid *string
	if u.messageID != "" {
		mid = &u.messageID
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(s.sql.claimOne, u.namespace, u.key, u.fp, mid, u.payload, u.attempt)
	tx, br, err := s.beginBatch(ctx, b)
	if err != nil {
		return nil, 0, err
	}
	fence, found, err := readFence(br)
	if err == nil && !found {
		err = s.unclaimed(ctx, tx, []*unit{u})
		if err == nil {
			err = u.err
		}
	}
	if err != nil {
		tx.rollback(context.WithoutCancel(ctx))
		return nil, 0, err
	}
	return tx, fence, nil
}

// readFence reads BEGIN's and a one-key claim's results (the fence, or no
// row) from br, and closes it.
func readFence(br pgx.BatchResults) (fence int64, found bool, err error) {
	defer func() {
		if cerr := br.Close(); err == nil && cerr != nil {
			err = infraError(ReasonDBConnection, fmt.Errorf("inbox: claim: %w", cerr))
		}
	}()
	if _, err := br.Exec(); err != nil {
		return 0, false, infraError(ReasonDBConnection, fmt.Errorf("inbox: begin: %w", err))
	}
	err = br.QueryRow().Scan(&fence)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, false, nil
	case err != nil:
		return 0, false, infraError(ReasonDBConnection, fmt.Errorf("inbox: claim: %w", err))
	}
	return fence, true, nil
}

// claimedUnit is a unit whose key a batch's claim took, with the fence.
type claimedUnit struct {
	u     *unit
	fence int64
}

// claimMany sends BEGIN and the claim of all units' keys (one statement,
// in key order) in one round trip; for a batch of claim mode's
// completions, their fenced completion instead. It returns the open
// transaction and the units whose key it took; the others have their
// verdict in u.err. On error the transaction is rolled back.
func (s *Store) claimMany(ctx context.Context, units []*unit) (*lazyTx, []claimedUnit, error) {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	if units[0].claim != nil {
		s.queueCompletion(b, units)
	} else {
		s.queueClaim(b, units)
	}
	tx, br, err := s.beginBatch(ctx, b)
	if err != nil {
		return nil, nil, err
	}
	claimed, missing, err := readFences(br, units)
	if err == nil && len(missing) > 0 {
		err = s.unclaimed(ctx, tx, missing)
	}
	if err != nil {
		tx.rollback(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	return tx, claimed, nil
}

// queueClaim queues the claim of units' keys, in one statement.
func (s *Store) queueClaim(b *pgx.Batch, units []*unit) {
	b.Queue(s.sql.claim, claimArrays(units)...)
}

// claimArrays are the group claim's parameters for units, in their order:
// consumers, keys, fingerprints, message ids, payloads, attempts.
func claimArrays(units []*unit) []any {
	n := len(units)
	consumers, keys := make([]string, n), make([]string, n)
	fps, payloads := make([][]byte, n), make([][]byte, n)
	mids := make([]*string, n)
	attempts := make([]int32, n)
	for i, u := range units {
		consumers[i], keys[i], fps[i], payloads[i] = u.namespace, u.key, u.fp, u.payload
		attempts[i] = int32(min(u.attempt, math.MaxInt32)) //nolint:gosec // bounded above
		mids[i] = messageIDArg(u)
	}
	return []any{consumers, keys, fps, mids, payloads, attempts}
}

// queueCompletion queues the fenced completion of the claims of units,
// in one statement. It marks them completed in the batch's transaction
// before their handlers run: a handler that fails is rolled back to its
// savepoint and its row marked failed (failInTx), which releases the claim.
func (s *Store) queueCompletion(b *pgx.Batch, units []*unit) {
	n := len(units)
	consumers, keys, owners, fences := make([]string, n), make([]string, n), make([]string, n), make([]int64, n)
	for i, u := range units {
		consumers[i], keys[i], owners[i], fences[i] = u.claim.Namespace, u.claim.Key, u.claim.Token, u.claim.Fence
	}
	b.Queue(s.sql.completeMany, consumers, keys, owners, fences)
}

// readFences reads BEGIN's and a batch claim's results ((consumer, key,
// fence) per key taken) from br, and closes it: the units whose key was
// taken, and the others.
func readFences(br pgx.BatchResults, units []*unit) (claimed []claimedUnit, missing []*unit, err error) {
	defer func() {
		if cerr := br.Close(); err == nil && cerr != nil {
			err = infraError(ReasonDBConnection, fmt.Errorf("inbox: claim: %w", cerr))
		}
	}()
	if _, err := br.Exec(); err != nil {
		return nil, nil, infraError(ReasonDBConnection, fmt.Errorf("inbox: begin: %w", err))
	}
	rows, err := br.Query()
	if err != nil {
		return nil, nil, infraError(ReasonDBConnection, fmt.Errorf("inbox: claim: %w", err))
	}
	fences := make(map[unitKey]int64, len(units))
	var k unitKey
	var fence int64
	_, err = pgx.ForEachRow(rows, []any{&k.consumer, &k.key, &fence}, func() error {
		fences[k] = fence
		return nil
	})
	if err != nil {
		return nil, nil, infraError(ReasonDBConnection, fmt.Errorf("inbox: claim: %w", err))
	}
	claimed = make([]claimedUnit, 0, len(fences))
	for _, u := range units {
		if f, ok := fences[unitKey{u.namespace, u.key}]; ok {
			claimed = append(claimed, claimedUnit{u: u, fence: f})
		} else {
			missing = append(missing, u)
		}
	}
	return claimed, missing, nil
}

// unclaimed sets in u.err the verdict of each unit whose key was not
// claimed, from the key's row as tx sees it.
func (s *Store) unclaimed(ctx context.Context, tx pgx.Tx, units []*unit) error {
	consumers := make([]string, len(units))
	keys := make([]string, len(units))
	for i, u := range units {
		consumers[i], keys[i] = u.namespace, u.key
	}
	rows, err := tx.Query(ctx, s.sql.lookup, consumers, keys)
	if err != nil {
		return infraError(ReasonDBConnection, fmt.Errorf("inbox: look up duplicates: %w", err))
	}
	type state struct {
		status string
		fp     []byte
		lease  float64
		result []byte
	}
	found := make(map[unitKey]state, len(units))
	var k unitKey
	var st state
	var lease *float64
	var result *string
	_, err = pgx.ForEachRow(rows, []any{&k.consumer, &k.key, &st.status, &st.fp, &lease, &result}, func() error {
		st.lease, st.result = 0, nil
		if lease != nil {
			st.lease = *lease
		}
		if result != nil {
			st.result = []byte(*result)
		}
		found[k] = st
		return nil
	})
	if err != nil {
		return infraError(ReasonDBConnection, fmt.Errorf("inbox: look up duplicates: %w", err))
	}
	for _, u := range units {
		st, ok := found[unitKey{u.namespace, u.key}]
		u.err = verdict(u, st.status, st.fp, time.Duration(st.lease*float64(time.Second)), ok)
		u.result = st.result
	}
	return nil
}

// heldDeferral is how long a delivery whose key another worker holds
// (remaining: the claim's remaining lease) waits before it looks again: a
// second, or twice what it waited since it last met a held claim, and
// never past the lease, when a crashed holder's claim may be taken over.
// The holder is most often alive and done within the second; a key held
// for long is looked at less and less often. At least a second, the
// shortest broker delay tier.
func heldDeferral(since, remaining time.Duration) time.Duration {
	return max(time.Second, min(2*since, remaining))
}

// verdict explains why a key could not be claimed, or, for a claim's
// completion, why the claim was no longer its owner's.
func verdict(u *unit, status string, fp []byte, lease time.Duration, found bool) error {
	if u.claim != nil {
		return u.claim.lostVerdict(status)
	}
	switch {
	case found && status == RecordCompleted && fp != nil && u.fp != nil && !bytes.Equal(fp, u.fp):
		return retry.Permanent(fmt.Errorf("inbox: key %q of namespace %q: %w", u.key, u.namespace, retry.ErrKeyConflict))
	case found && status == RecordCompleted:
		return retry.Duplicate(retry.SourceInbox, fmt.Errorf("inbox: key %q of namespace %q is completed", u.key, u.namespace))
	case found && status == RecordProcessing:
		return retry.WithReason(ReasonClaimHeld, retry.Defer(heldDeferral(u.sinceHeld, lease),
			fmt.Errorf("inbox: key %q of namespace %q is claimed by another worker", u.key, u.namespace)))
	default:
		// The row changed between the claim and the look-up (such as a
		// retention delete): try again.
		return retry.WithReason(ReasonClaimHeld, retry.Retryable(
			fmt.Errorf("inbox: key %q of namespace %q could not be claimed (status %q)", u.key, u.namespace, status)))
	}
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
	if _, err := s.pool.Exec(ctx, s.sql.failAuto, u.namespace, u.key, u.fp, mid, errorText(herr), u.attempt); err != nil {
		s.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "inbox: record failed attempt",
			slog.String("namespace", u.namespace), slog.String("key", u.key), slog.Any("error", err))
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
