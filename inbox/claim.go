package inbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// ClaimFunc handles one message in claim/lease mode: for effects outside
// PostgreSQL (a payment gateway, an e-mail). It should pass c.Key
// downstream as the Idempotency-Key, wrap each outside call in c.Step, and
// commit its business writes with c.Complete. Returning nil without calling
// Complete completes the claim with no business writes.
type ClaimFunc[T any] func(ctx context.Context, c *Claim, msg *inboxtype.Message[T]) error

// ClaimOpts are per-handler settings of [ClaimHandler]. A nil *ClaimOpts
// means defaults.
type ClaimOpts struct {
	// Lease is how long a claim stays valid without a heartbeat; a crashed
	// worker's claim may be taken over after it. Defaults to 30s.
	Lease time.Duration
	// MaxLease caps the heartbeat's extensions, measured from the claim.
	// Past it the handler's context is cancelled with ErrLeaseLost. Size it
	// below RabbitMQ's consumer ack timeout (30 minutes by default), or the
	// broker closes the channel first. Defaults to 10 minutes.
	MaxLease time.Duration
	// Heartbeat is the interval between lease extensions. Defaults to
	// Lease/3.
	Heartbeat time.Duration
	// StorePayload stores the raw body in the claim's row, so that the
	// reconciler can replay a claim its worker left behind. Defaults to
	// false.
	StorePayload bool
	// EffectCheck tells the reconciler whether the outside effect of a
	// claim its worker left behind happened (the gateway knows the key):
	// then the claim is completed instead of released for a retry. A
	// worker hands it to its reconciler (ReconcilerConfig.EffectChecks).
	// Defaults to nil: such claims are released.
	EffectCheck EffectCheck
	// DurableClaim makes the claim durable before the handler runs.
	// Defaults to false: the claim is committed without waiting for its
	// disk flush, which saves a flush per delivery. That is safe because
	// nothing is acked on the strength of a claim: a claim lost in a
	// database crash makes the fenced completion find no claim, and the
	// delivery is retried (reason lease_lost), never acked; the outside
	// call then repeats with the same idempotency key, as after a worker
	// crash. The completion, which is what an ack stands on, is always
	// durable, and makes the claim durable with it. One thing a lost claim
	// does take back is its fence: the next claim of the key may get the
	// same Claim.Fence again. Set DurableClaim if an outside system fences
	// its writes on Claim.Fence.
	DurableClaim bool
}

func (o *ClaimOpts) withDefaults() (ClaimOpts, error) {
	var out ClaimOpts
	if o != nil {
		out = *o
	}
	if out.Lease <= 0 {
		out.Lease = 30 * time.Second
	}
	if out.MaxLease <= 0 {
		out.MaxLease = 10 * time.Minute
	}
	if out.Heartbeat <= 0 {
		out.Heartbeat = out.Lease / 3
	}
	if out.MaxLease < out.Lease {
		return out, fmt.Errorf("inbox: MaxLease %s is below Lease %s", out.MaxLease, out.Lease)
	}
	if out.Heartbeat >= out.Lease {
		return out, fmt.Errorf("inbox: Heartbeat %s must be shorter than Lease %s", out.Heartbeat, out.Lease)
	}
	return out, nil
}

// Claim is a worker's hold on one idempotency key in claim/lease mode. Its
// methods are safe for concurrent use. The zero value is not usable; the
// claim handler builds it.
type Claim struct {
	// Namespace is the inbox namespace.
	Namespace string
	// Key is the idempotency key: pass it downstream (as Idempotency-Key) so
	// that a repeated outside call after a crash is recognised there.
	Key string
	// Token is this claim's random owner token.
	Token string
	// Fence increases with every claim of the key; a completion is accepted
	// only with the current owner token and fence.
	Fence int64
	// Attempt is the delivery's broker attempt (x-attempt, 1-based), as
	// recorded on the row (Record.Attempts). A claim after a crash or a
	// takeover has the attempt of its delivery; a Fence above 1 tells that
	// the key was claimed before.
	Attempt int

	s     *Store
	batch *batcher // the handler's group commit (ClaimHandler's gc), or nil
	// result is the message whose result (inboxtype.Message.SetResult)
	// Complete stores; nil for none.
	result resulter
	// won is the result stored by the owner that completed the key, read
	// when this claim was fenced out.
	won []byte
	// stored is the result Complete committed (nil for none); c.mu.
	stored []byte
	mu     sync.Mutex // serialises the row's updates: heartbeat, Step, Complete
	// stepsRaw is the steps column as the claim read it (JSON), decoded
	// into steps by the first Step: a handler that records no step pays
	// for no decoding.
	stepsRaw []byte
	steps    map[string]json.RawMessage
	done     bool
	// req and tx are the claim's request and Complete's transaction, kept
	// here to save two allocations per delivery.
	req leaseReq
	tx  lazyTx
	hb  beat // the lease's heartbeat, while the handler runs
	// releaseErr is the handler's error kept for a release retried when
	// the database answers again (owner.go).
	releaseErr error
}

// resulter is what a claim reads its handler's result from: the message.
type resulter interface{ Result() json.RawMessage }

// Step runs fn as recovery point name, once per key across attempts: if an
// earlier attempt recorded the step, fn is skipped and the recorded result
// returned. Otherwise fn runs and its result (JSON-encoded; nil becomes
// null; keep it small) is recorded on the claim, fenced. If the claim was
// taken over meanwhile, Step returns the result with an error matching
// retry.ErrDuplicate (source fenced): the handler should return it.
func (c *Claim) Step(ctx context.Context, name string, fn func(ctx context.Context) (any, error)) (json.RawMessage, error) {
	c.mu.Lock()
	if err := c.loadSteps(); err != nil {
		c.mu.Unlock()
		return nil, err
	}
	if r, ok := c.steps[name]; ok {
		c.mu.Unlock()
		return r, nil
	}
	c.mu.Unlock()
	v, err := fn(ctx)
	if err != nil {
		return nil, err
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("inbox: step %q result: %w", name, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	tag, err := c.s.pool.Exec(ctx, c.s.sql.recordStep, c.Namespace, c.Key, c.Token, c.Fence, name, string(raw))
	if err != nil {
		return raw, infraError(ReasonDBConnection, fmt.Errorf("inbox: record step %q: %w", name, err))
	}
	if tag.RowsAffected() == 0 {
		return raw, c.lost(ctx)
	}
	c.steps[name] = raw
	return raw, nil
}

// loadSteps decodes the steps the claim read, once; c.mu is held.
func (c *Claim) loadSteps() error {
	if c.steps != nil {
		return nil
	}
	c.steps = map[string]json.RawMessage{}
	if len(c.stepsRaw) == 0 {
		return nil
	}
	if err := json.Unmarshal(c.stepsRaw, &c.steps); err != nil {
		c.steps = nil
		return fmt.Errorf("inbox: recorded steps of key %q: %w", c.Key, err)
	}
	c.stepsRaw = nil
	return nil
}

// Completed reports whether Complete succeeded.
func (c *Claim) Completed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done
}

func (c *Claim) fenced() error {
	return retry.Duplicate(retry.SourceFenced,
		fmt.Errorf("inbox: claim %d on key %q of namespace %q was taken over", c.Fence, c.Key, c.Namespace))
}

// lost is the verdict when a fenced write found the claim no longer ours.
// It is a duplicate (the delivery is acked) only if the key is completed:
// another owner committed the effect. A claim released by the reconciler,
// or taken over by a worker that has not completed yet, is not done — the
// delivery must be retried, never acked, or the job would be lost.
func (c *Claim) lost(ctx context.Context) error {
	var status string
	var result *string
	err := c.s.pool.QueryRow(ctx, `SELECT status, CASE WHEN status = 'completed' THEN result::text END FROM `+c.s.table+
		` WHERE consumer = $1 AND key = $2`, c.Namespace, c.Key).Scan(&status, &result)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return infraError(ReasonDBConnection, fmt.Errorf("inbox: look up a lost claim: %w", err))
	}
	if result != nil {
		c.won = []byte(*result)
	}
	return c.lostVerdict(status)
}

// lostVerdict is lost's verdict for the row's status ("" if there is no
// row).
func (c *Claim) lostVerdict(status string) error {
	switch status {
	case RecordCompleted:
		return c.fenced()
	case RecordProcessing:
		return retry.WithReason(ReasonClaimHeld, retry.Defer(time.Second, fmt.Errorf(
			"inbox: claim %d on key %q of namespace %q was taken over by a worker that has not completed", c.Fence, c.Key, c.Namespace)))
	default:
		return retry.WithReason(ReasonLeaseLost, retry.Retryable(fmt.Errorf(
			"inbox: claim %d on key %q of namespace %q was lost before completion (status %q)", c.Fence, c.Key, c.Namespace, status)))
	}
}

// ClaimHandler adapts h into a consumer handler for effects outside
// PostgreSQL. Per delivery:
//
//  1. the key is claimed before h runs: status processing, a random owner
//     token, fence+1, lease_until = now()+Lease, attempts set to the
//     delivery's broker attempt; the claim is committed without waiting for
//     its disk flush unless opts.DurableClaim (see there). Each delivery's
//     claim keeps its own verdict, also when the claims of concurrent
//     deliveries are sent together. Only a free (received, failed, dead)
//     row or an expired claim is taken; a live claim of another worker
//     asks for a retry after its lease (reason claim_held: the other may
//     still fail), and a completed key is a duplicate (or a key conflict if
//     the fingerprint differs);
//  2. a heartbeat extends the lease every Heartbeat, up to MaxLease; if an
//     extension fails or the cap is reached, h's context is cancelled with
//     cause ErrLeaseLost and StatusLockExpired reported;
//  3. h runs; Complete commits its business writes with the fenced
//     completion, and a late worker whose claim was taken over is fenced out
//     (a duplicate, nothing written);
//  4. if h fails, the claim is released (status failed, last_error,
//     last_failed_at; owner cleared) so a retry can take it.
//
// With gc set, the completions of deliveries handled concurrently share
// one transaction: Claim.Complete hands its completion to a batch; each
// Complete callback runs in its own savepoint, and one commit makes the
// batch durable before any Complete returns. A callback that fails is
// rolled back to its savepoint and its claim released in the same
// transaction; a claim taken over is fenced out as in per-message mode,
// alone, and nothing of it is written. What a callback may assume
// changes: it runs on the batch's transaction, in the goroutine of
// whichever delivery leads the batch, so a slow callback delays the
// batch's other completions; a callback can run twice, the first run
// rolled back — after a failed COMMIT (the batch's completions then run
// again one by one, so that only the one whose writes fail at COMMIT
// fails). Keep callbacks to the business writes. A nil gc means one
// transaction per completion.
//
// ClaimHandler panics if s or h is nil or opts is invalid (a start-up bug).
func ClaimHandler[T any](s *Store, h ClaimFunc[T], gc *GroupCommit, opts *ClaimOpts) inboxtype.Handler[T] {
	if s == nil || h == nil {
		panic("inbox: ClaimHandler needs a store and a handler")
	}
	o, err := opts.withDefaults()
	if err != nil {
		panic(err)
	}
	var b *batcher
	if gc != nil {
		if err := gc.validate(); err != nil {
			panic(err)
		}
		b = newBatcher(s, gc.withDefaults())
	}
	return inboxtype.HandlerFunc[T](func(ctx context.Context, msg *inboxtype.Message[T]) (err error) {
		defer func() { s.healPartitions(ctx, err) }()
		u, err := s.newUnit(ctx, msg.Namespace, msg.Key, msg.ID, msg.Attempt, msg.Delivery, msg.Fingerprint(), o.StorePayload)
		if err != nil {
			return err
		}
		takeResult(msg.Delivery) // left by an earlier run of this delivery
		if crashCounted(msg.Redelivered, msg.Delivery) {
			if err := s.countRedelivery(ctx, u); err != nil {
				return err
			}
		}
		c, capAt, err := s.claimLease(ctx, u, o)
		if err != nil {
			keepResult(msg.Delivery, nil, u.result, err)
			return err
		}
		c.batch = b
		c.result = msg
		processing(msg.Delivery, c.Fence)
		hctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		hb := s.heartbeat(hctx, cancel, c, o, capAt, msg.Delivery)
		returned := false
		defer func() {
			// h panicked on this delivery's own goroutine: the panic goes
			// on to the consumer's last guard, the one recover of the
			// path. Release the claim on the way, so that the retry takes
			// the key at once rather than after the lease.
			if returned {
				return
			}
			hb.stop()
			if !c.Completed() {
				s.release(ctx, c, retry.WithReason(retry.ReasonPanic, errors.New("inbox: handler panicked")))
			}
		}()
		herr := runClaimFunc(hctx, h, c, msg)
		returned = true
		hb.stop()
		if herr == nil && !c.Completed() {
			herr = c.Complete(hctx, nil)
		}
		if herr == nil || c.Completed() {
			// Completed is committed: an error after it must not retry a
			// job that is done (a later copy would be a duplicate anyway).
			c.mu.Lock()
			keepResult(msg.Delivery, c.stored, nil, nil)
			c.mu.Unlock()
			return nil
		}
		keepResult(msg.Delivery, nil, c.won, herr)
		if cause := context.Cause(hctx); errors.Is(cause, ErrLeaseLost) && ctx.Err() == nil {
			herr = retry.WithReason(ReasonLeaseLost, retry.Retryable(errors.Join(herr, cause)))
		}
		if !c.Completed() {
			s.release(ctx, c, herr)
		}
		return MapError(herr)
	})
}

func runClaimFunc[T any](ctx context.Context, h ClaimFunc[T], c *Claim, msg *inboxtype.Message[T]) (err error) {
	ctx, span := startSpan(ctx, "inbox.handler")
	defer func() { endSpan(span, err) }()
	return h(ctx, c, msg)
}

func newToken() string {
	var b [16]byte
	var h [32]byte
	_, _ = rand.Read(b[:])
	hex.Encode(h[:], b[:])
	return string(h[:])
}

// claimLease takes the key in claim mode; it returns the claim and the
// database time at which its lease can be extended no further.
func (s *Store) claimLease(ctx context.Context, u *unit, o ClaimOpts) (c *Claim, capAt time.Time, err error) {
	ctx, span := startSpan(ctx, "inbox.claim")
	defer func() { endSpan(span, err) }()
	c = &Claim{Namespace: u.namespace, Key: u.key, Token: newToken(), s: s}
	r := &c.req
	*r = leaseReq{u: u, token: c.Token, lease: o.Lease.Microseconds(), durable: o.DurableClaim}
	if sess := s.owner.session(); sess != nil {
		r.session = &sess.key
	}
	err = s.leases.Do(ctx, r)
	if err == nil {
		err = r.err
	}
	if err != nil {
		return nil, time.Time{}, infraError(ReasonDBConnection, fmt.Errorf("inbox: claim: %w", err))
	}
	if !r.claimed {
		return nil, time.Time{}, s.explainOne(ctx, u)
	}
	c.Fence, c.Attempt, c.stepsRaw = r.fence, r.attempts, r.steps
	return c, r.now.Add(o.MaxLease), nil
}

// explainOne is explainUnclaimed for a key claimed outside a transaction.
func (s *Store) explainOne(ctx context.Context, u *unit) error {
	var status string
	var fp []byte
	var lease float64
	var result *string
	err := s.pool.QueryRow(ctx, s.sql.lookup, []string{u.namespace}, []string{u.key}).Scan(new(string), new(string), &status, &fp, &lease, &result)
	if result != nil {
		u.result = []byte(*result)
	}
	found := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return infraError(ReasonDBConnection, fmt.Errorf("inbox: look up claim: %w", err))
	}
	return verdict(u, status, fp, time.Duration(lease*float64(time.Second)), found)
}

// heartbeat extends c's lease until the returned beat's stop is called.
// When an extension fails, or once the lease reached capAt and ran out, it
// cancels the handler's context with ErrLeaseLost. stop is idempotent and
// returns once no extension is under way.
//
// It is a timer, not a goroutine: most claims end long before their first
// extension is due, and a timer costs a delivery less than a goroutine
// with a ticker and a context of its own.
func (s *Store) heartbeat(ctx context.Context, cancel context.CancelCauseFunc, c *Claim, o ClaimOpts, capAt time.Time, d *inboxtype.Delivery) *beat {
	b := &c.hb // the claim holds it: one allocation fewer per delivery
	b.s, b.c, b.o, b.capAt, b.ctx, b.cancel, b.d = s, c, o, capAt, ctx, cancel, d
	b.mu.Lock()
	b.t = time.AfterFunc(o.Heartbeat, b.extend)
	b.mu.Unlock()
	return b
}

// beat is one claim's heartbeat (see heartbeat).
type beat struct {
	s      *Store
	c      *Claim
	o      ClaimOpts
	capAt  time.Time
	ctx    context.Context //nolint:containedctx // the handler's context, under which extensions run
	cancel context.CancelCauseFunc
	d      *inboxtype.Delivery

	mu      sync.Mutex
	t       *time.Timer
	capped  bool               // the lease reached capAt: the timer's next firing ends it
	stopped bool               // stop was called: nothing more is scheduled
	abort   context.CancelFunc // ends the extension under way, if any
	running sync.WaitGroup     // the timer's function under way
}

// enter marks the timer's function as running; it reports false once
// stop was called or the handler's context ended.
func (b *beat) enter() (ok, capped bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped || b.ctx.Err() != nil {
		return false, false
	}
	b.running.Add(1)
	return true, b.capped
}

// extend is the timer's function: it extends the lease and schedules the
// next extension, or, once the lease is capped, reports it lost.
func (b *beat) extend() {
	ok, capped := b.enter()
	if !ok {
		return
	}
	defer b.running.Done()
	if capped {
		b.lost(fmt.Errorf("%w: MaxLease %s reached", ErrLeaseLost, b.o.MaxLease))
		return
	}
	ctx, abort := context.WithCancel(b.ctx)
	defer abort()
	b.mu.Lock()
	b.abort = abort
	b.mu.Unlock()

	began := time.Now()
	capped, left, err := b.s.extend(ctx, b.c, b.o, b.capAt)
	done := b.c.Completed()

	b.mu.Lock()
	b.abort = nil
	if b.stopped || ctx.Err() != nil || done {
		b.mu.Unlock()
		return
	}
	if err != nil {
		b.mu.Unlock()
		b.lost(fmt.Errorf("%w: %w", ErrLeaseLost, err))
		return
	}
	next := max(b.o.Heartbeat-time.Since(began), 0)
	if capped {
		b.capped, next = true, left
	}
	b.t.Reset(next)
	b.mu.Unlock()
}

// lost reports the lease lost and cancels the handler's context with err.
func (b *beat) lost(err error) {
	if b.d != nil {
		b.d.Transition(inboxtype.StatusLockExpired, err)
	}
	b.cancel(err)
}

// stop ends the heartbeat and waits for an extension under way.
func (b *beat) stop() {
	b.mu.Lock()
	b.stopped = true
	b.t.Stop()
	if b.abort != nil {
		b.abort()
	}
	b.mu.Unlock()
	b.running.Wait()
}

var errTakenOver = errors.New("inbox: claim taken over")

func (s *Store) extend(ctx context.Context, c *Claim, o ClaimOpts, capAt time.Time) (capped bool, left time.Duration, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return false, 0, nil
	}
	var secs float64
	err = s.pool.QueryRow(ctx, s.sql.extendLease, c.Namespace, c.Key, c.Token, c.Fence, o.Lease.Microseconds(), capAt).Scan(&capped, &secs)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, 0, errTakenOver
	}
	return capped, time.Duration(secs * float64(time.Second)), err
}

// release gives the claim up after a failed attempt, so that a retry can
// take it; it is fenced, so it never touches another owner's claim.
//
// A release that fails (the database away) is kept and retried by a
// started store once the database answers again (owner.go); meanwhile a
// copy may take the claim as soon as its owner session is gone.
func (s *Store) release(ctx context.Context, c *Claim, herr error) {
	err := s.releaseOnce(ctx, c, herr)
	if err == nil {
		return
	}
	msg := "inbox: release claim failed; it is released when PostgreSQL answers again"
	c.releaseErr = herr
	select {
	case <-s.owner.svc.Stopped(): // not started: nothing would retry it
		msg = "inbox: release claim failed; the reconciler releases it after its lease"
	default:
		if !s.owner.keep(c) {
			msg = "inbox: release claim failed and too many releases wait already; the reconciler releases it after its lease"
		}
	}
	s.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, msg,
		slog.String("namespace", c.Namespace), slog.String("key", c.Key), slog.Int64("fence", c.Fence), slog.Any("error", err))
}

// releaseOnce runs the fenced release once.
func (s *Store) releaseOnce(ctx context.Context, c *Claim, herr error) error {
	ctx, cancel := s.cleanupCtx(ctx)
	defer cancel()
	_, err := s.pool.Exec(ctx, s.sql.releaseClaim, c.Namespace, c.Key, c.Token, c.Fence, errorText(herr))
	return err
}
