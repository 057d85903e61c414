package inbox

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxmq/inboxmq/internal/combine"
)

// leaseReq is one delivery's claim in claim mode, and its answer.
type leaseReq struct {
	u       *unit
	token   string
	session *int64 // the owner session's key; nil: none (owner.go)
	lease   int64  // µs
	durable bool

	claimed  bool // false: the row was not free (see explainOne)
	fence    int64
	attempts int
	steps    []byte // the steps column (JSON); nil if none were recorded
	now      time.Time
	err      error
}

// newLeaseRounds returns the combiner through which claim mode's claims
// go: claims of concurrent deliveries that coincide share one statement
// (claimLeases) — one round trip and one transaction instead of one each.
// A round holds each key once (a second claim of a key waits for the next
// round, where it meets the first one's outcome) and commits
// asynchronously only if every claim in it may.
func (s *Store) newLeaseRounds() *combine.Combiner[*leaseReq] {
	return combine.New(s.sendLeases, func(q []*leaseReq) []bool {
		now := make([]bool, len(q))
		seen := make(map[unitKey]struct{}, len(q))
		for i, r := range q {
			k := unitKey{r.u.namespace, r.u.key}
			if _, dup := seen[k]; !dup {
				seen[k] = struct{}{}
				now[i] = true
			}
		}
		return now
	})
}

// sendLeases claims batch: alone with claimLease, else in one claimLeases
// statement, whose context ends when every caller's has.
func (s *Store) sendLeases(batch []*leaseReq) {
	if len(batch) == 1 {
		// A round of one runs under its caller's context.
		s.sendLease(batch[0].u.ctx, batch[0], !batch[0].durable)
		return
	}
	units := make([]*unit, len(batch))
	async := true
	for i, r := range batch {
		units[i] = r.u
		async = async && !r.durable
	}
	ctx, done := batchContext(units)
	defer done()

	n := len(batch)
	consumers, keys, owners, mids := make([]string, n), make([]string, n), make([]string, n), make([]*string, n)
	leases, fps, payloads, attempts := make([]int64, n), make([][]byte, n), make([][]byte, n), make([]int32, n)
	sessions := make([]*int64, n)
	byKey := make(map[unitKey]*leaseReq, n)
	for i, r := range batch {
		consumers[i], keys[i], owners[i], mids[i], sessions[i] = r.u.namespace, r.u.key, r.token, messageIDArg(r.u), r.session
		leases[i], fps[i], payloads[i] = r.lease, r.u.fp, r.u.payload
		attempts[i] = int32(min(r.u.attempt, math.MaxInt32)) //nolint:gosec // bounded above
		byKey[unitKey{r.u.namespace, r.u.key}] = r
	}
	sql := s.sql.claimLeases
	if async {
		sql = s.sql.claimLeasesAsync
	}
	args := []any{consumers, keys, owners, leases, fps, mids, payloads, attempts}
	if s.sessions {
		args = append(args, sessions)
	}
	rows, err := s.pool.Query(ctx, sql, args...)
	if err == nil {
		var k unitKey
		var fence int64
		var attempts int
		var steps []byte
		var now time.Time
		dest := []any{&k.consumer, &k.key, &fence, &attempts, &steps, &now}
		if async {
			dest = append(dest, nil)
		}
		for rows.Next() {
			steps = nil
			if err = rows.Scan(dest...); err != nil {
				break
			}
			if r := byKey[k]; r != nil {
				r.claimed, r.fence, r.attempts, r.steps, r.now = true, fence, attempts, steps, now
			}
		}
		rows.Close()
		err = errors.Join(err, rows.Err())
	}
	if err != nil && isPermanent(err) {
		// One key's values cannot be stored (a NUL byte, say), and the
		// statement failed for all: claim each alone, so that only the bad
		// one fails.
		for _, r := range batch {
			r.claimed, r.err = false, nil
			s.sendLease(ctx, r, !r.durable)
		}
		return
	}
	if err != nil {
		// No claim of the round is used. A failed statement wrote none (it
		// is one transaction); after an answer lost or misread, any claim
		// it did write is freed by its lease, as for a single claim.
		for _, r := range batch {
			r.claimed, r.err = false, err
		}
	}
}

// sendLease claims r's key alone, with claimLease.
func (s *Store) sendLease(ctx context.Context, r *leaseReq, async bool) {
	// The asynchronous statement returns set_config's value too; nil skips it.
	sql, dest := s.sql.claimLeaseAsync, []any{&r.fence, &r.attempts, &r.steps, &r.now, nil}
	if !async {
		sql, dest = s.sql.claimLease, dest[:4]
	}
	args := []any{r.u.namespace, r.u.key, r.token, r.lease, r.u.fp, messageIDArg(r.u), r.u.payload, r.u.attempt}
	if s.sessions {
		args = append(args, r.session)
	}
	err := s.pool.QueryRow(ctx, sql, args...).Scan(dest...)
	r.claimed = err == nil
	if !errors.Is(err, pgx.ErrNoRows) {
		r.err = err
	}
}

// messageIDArg is u's message id as a nullable parameter.
func messageIDArg(u *unit) *string {
	if u.messageID == "" {
		return nil
	}
	return &u.messageID
}
