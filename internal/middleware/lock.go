package middleware

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/lock"
	"github.com/inboxmq/inboxmq/retry"
)

// Values of inboxtype.Delivery.LockResult set by [Lock].
const (
	// LockAcquired: this worker holds the lock while the handler runs.
	LockAcquired = "acquired"
	// LockHeld: another worker holds the lock; the delivery is retried later.
	LockHeld = "held"
	// LockDegraded: Redis did not answer in time; the handler ran without the
	// lock (the inbox still keeps the effect single).
	LockDegraded = "degraded"
)

// Retry reasons returned by [Lock]. They are bounded metric labels.
const (
	// ReasonLockUnavailable: another worker holds the key's lock.
	ReasonLockUnavailable = "lock_unavailable"
	// ReasonLockExpired: the lock was lost (or its MaxHold reached) before
	// the handler completed.
	ReasonLockExpired = "lock_expired"
)

// tracerName is the instrumentation scope of this package's spans.
const tracerName = "github.com/inboxmq/inboxmq/internal/middleware"

// Bounds of LockOpts.TTL.
const (
	// MinLockTTL is the shortest lock TTL [Lock] accepts. Below it, one
	// slow Redis answer or a pause of the worker lets a live handler's lock
	// run out between two refreshes, and each loss costs the delivery a
	// counted attempt.
	MinLockTTL = time.Second
	// MaxLockTTL is the longest lock TTL [Lock] accepts. The TTL is how long
	// a key stays locked after its holder died; a live holder needs no long
	// TTL, since its keep-alive holds the lock for up to MaxHold whatever
	// the TTL. Beyond ten minutes a crashed worker would block its keys for
	// longer than a retry tier waits.
	MaxLockTTL = 10 * time.Minute
)

// lockLease caps the TTL an obtain sets; the keep-alive's first refresh
// extends the lock to LockOpts.TTL.
const lockLease = 5 * time.Second

// LockOpts configure [Lock]. A nil *LockOpts means defaults; a value out of
// its documented range makes Lock return an error.
type LockOpts struct {
	// Prefix starts every lock key: "<Prefix><consumer>:<idempotency key>".
	// Defaults to "inboxmq:lock:".
	Prefix string
	// TTL is how long the lock outlives a worker that died holding it. A
	// keep-alive refreshes it while the handler runs (up to MaxHold). An
	// obtain first sets the lock for at most a few seconds, which the
	// keep-alive's first refresh extends to TTL, so an obtain that Redis
	// ran after the worker gave up on it (Redis hung) blocks its key for
	// seconds, not for TTL. Between MinLockTTL (1s) and MaxLockTTL (10m).
	// Defaults to 30s.
	TTL time.Duration
	// MaxHold caps how long one delivery may hold the lock; at the cap the
	// handler's context is cancelled and the delivery retried (reason
	// lock_expired). Keep it below RabbitMQ's consumer ack timeout. Where
	// TTL bounds how long a dead holder blocks a key, MaxHold bounds a live
	// one. Defaults to 25 minutes; -1 means no cap.
	MaxHold time.Duration
	// RetryDelay is the first delay asked for when another worker holds the
	// lock (retry.Defer: not counted as an attempt, so a contended key is
	// never dead-lettered for it). A delivery deferred again waits twice as
	// long as it last waited, so a key held for long is tried less and less
	// often, but never longer than the holder's remaining TTL: a key whose
	// holder died is tried again when its lock runs out, and a live
	// holder's lock never has more than TTL left. Defaults to 5s.
	RetryDelay time.Duration
	// CallTimeout bounds each Redis call (obtain, refresh, release). Past it
	// the handler proceeds without the lock. Build the client with
	// ContextTimeoutEnabled so the bound covers socket reads. Less than a
	// third of TTL (refreshes come every TTL/3). Defaults to 150ms.
	CallTimeout time.Duration
	// ProbeInterval: while Redis is degraded, it is tried at most once per
	// ProbeInterval; other deliveries proceed without the lock at once
	// instead of each waiting CallTimeout. Defaults to 1s; -1 tries Redis on
	// every delivery.
	ProbeInterval time.Duration
	// Logger logs each change between healthy and degraded (once per
	// change, at warn and info). Defaults to no logging.
	Logger *slog.Logger
	// OnDegraded is called on each change between healthy and degraded:
	// true when Redis stopped answering, false when it answers again. It is
	// called synchronously on the delivery path, once per change; keep it
	// fast. Defaults to nothing.
	OnDegraded func(degraded bool)
}

func (o *LockOpts) withDefaults() LockOpts {
	var out LockOpts
	if o != nil {
		out = *o
	}
	if out.Prefix == "" {
		out.Prefix = "inboxmq:lock:"
	}
	if out.TTL == 0 {
		out.TTL = 30 * time.Second
	}
	if out.MaxHold == 0 {
		out.MaxHold = 25 * time.Minute
	}
	if out.RetryDelay == 0 {
		out.RetryDelay = 5 * time.Second
	}
	if out.CallTimeout == 0 {
		out.CallTimeout = 150 * time.Millisecond
	}
	if out.ProbeInterval == 0 {
		out.ProbeInterval = time.Second
	}
	return out
}

func (o LockOpts) validate() error {
	switch {
	case o.TTL < MinLockTTL || o.TTL > MaxLockTTL:
		return fmt.Errorf("middleware: Lock: TTL %s is out of range: want %s to %s", o.TTL, MinLockTTL, MaxLockTTL)
	case o.MaxHold < -1:
		return fmt.Errorf("middleware: Lock: MaxHold %s: want a positive duration, or -1 for no cap", o.MaxHold)
	case o.RetryDelay < 0:
		return fmt.Errorf("middleware: Lock: RetryDelay %s: want a positive duration", o.RetryDelay)
	case o.CallTimeout < 0 || o.CallTimeout >= o.TTL/3:
		return fmt.Errorf("middleware: Lock: CallTimeout %s: want a positive duration below a third of TTL (%s)", o.CallTimeout, o.TTL/3)
	case o.ProbeInterval < -1:
		return fmt.Errorf("middleware: Lock: ProbeInterval %s: want a positive duration, or -1 to probe on every delivery", o.ProbeInterval)
	}
	return nil
}

// Lock returns a handler middleware that holds a Redis lock on the
// delivery's idempotency key while the rest of the chain runs. It belongs
// in HandlerOpts.Middleware (after decoding, so Delivery.Key is set). A
// delivery without a key means the lock is mounted where no key is set
// (router-wide, or on a route whose payload does not implement
// inboxtype.Keyer): it fails permanently, with an error that says so, and
// next is not called.
//
// The lock only saves work: the inbox in PostgreSQL keeps the effect single
// whatever Redis does. So:
//
//   - acquired: Delivery.LockKey, LockResult "acquired" and LockFence are set,
//     StatusLocked is reported, and next runs with a context that a
//     keep-alive cancels if the lock is lost; the lock is released when
//     next returns, never touching a lock another worker took since;
//   - held by another worker: next is not called; the result is
//     retry.Defer (not counted as an attempt) with reason
//     "lock_unavailable", after RetryDelay, growing for a delivery
//     deferred again, and never longer than the holder's remaining TTL
//     (see LockOpts.RetryDelay); StatusLockFailed is reported;
//   - lost before completion (deleted, expired while Redis was silent, or
//     MaxHold reached): next's context is cancelled with the cause
//     (lock.ErrLockLost or lock.ErrMaxHoldReached), StatusLockExpired is
//     reported, and an error from next becomes retryable with reason
//     "lock_expired" (nil and duplicates pass unchanged);
//   - Redis error or timeout: next runs without the lock (LockResult
//     "degraded"), reported through OnDegraded and the logger once per
//     change; the middleware recovers by itself when Redis answers again.
//     An obtain it gave up on may still run when Redis answers: the lock
//     it sets lives for a few seconds (see LockOpts.TTL), not for TTL.
//
// Mounted after [Cache], a delivery whose job the cache records as
// completed takes no lock.
//
// The Redis keys and scripts are described in docs/internals.md.
//
// A "lock.acquire" span is started as a child of the span in ctx (none
// without one). A nil client or options out of range are an error.
func Lock(client redis.UniversalClient, opts *LockOpts) (inboxtype.Middleware, error) {
	if client == nil {
		return nil, errors.New("middleware: Lock: nil redis client")
	}
	o := opts.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	m := &lockMiddleware{
		opts:   o,
		client: client,
		health: newHealth("lock", o.ProbeInterval, o.Logger, o.OnDegraded),
	}
	return m.wrap, nil
}

type lockMiddleware struct {
	opts   LockOpts
	client lock.Client
	health *health
}

func (m *lockMiddleware) wrap(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
	return func(ctx context.Context, d *inboxtype.Delivery) error {
		if d.Key == "" {
			return errNoKey("Lock")
		}
		key := m.opts.Prefix + d.Namespace + ":" + d.Key
		d.LockKey = key
		if !m.health.allow() {
			d.LockResult = LockDegraded
			return next(ctx, d)
		}
		sctx, span := startLockSpan(ctx, key)
		cctx, cancel := context.WithTimeout(sctx, m.opts.CallTimeout)
		l, err := lock.Obtain(cctx, m.client, key, m.opts.TTL, lockLease)
		cancel()

		switch {
		case err == nil:
			m.health.set(false, nil)
			d.LockResult = LockAcquired
			d.LockFence = l.Fence()
			if span.IsRecording() {
				span.SetAttributes(attribute.String("inboxmq.lock.result", LockAcquired), attribute.Int64("inboxmq.lock.fence", l.Fence()))
			}
			span.End()
			d.Transition(inboxtype.StatusLocked, nil)
			return m.runLocked(ctx, d, l, next)

		case errors.Is(err, lock.ErrNotObtained):
			m.health.set(false, nil)
			d.LockResult = LockHeld
			span.SetAttributes(attribute.String("inboxmq.lock.result", LockHeld))
			span.End()
			herr := retry.WithReason(ReasonLockUnavailable, retry.Defer(m.deferral(d, err, time.Now()),
				fmt.Errorf("middleware: lock %q is held by another worker: %w", key, err)))
			d.Transition(inboxtype.StatusLockFailed, herr)
			return herr

		case ctx.Err() != nil:
			// The delivery's own context ended (shutdown): not a Redis fault.
			span.RecordError(err)
			span.SetStatus(codes.Error, "context ended")
			span.End()
			return err

		default:
			m.health.set(true, err)
			d.LockResult = LockDegraded
			span.SetAttributes(attribute.String("inboxmq.lock.result", LockDegraded))
			span.RecordError(err)
			span.SetStatus(codes.Error, "redis unavailable")
			span.End()
			return next(ctx, d)
		}
	}
}

// startLockSpan starts the "lock.acquire" span under the span in ctx.
// Without a trace in ctx there is nothing to record under: it returns ctx
// and its non-recording span, and allocates nothing.
func startLockSpan(ctx context.Context, key string) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.SpanContext().IsValid() {
		return ctx, parent
	}
	return parent.TracerProvider().Tracer(tracerName).Start(ctx, "lock.acquire",
		trace.WithAttributes(attribute.String("inboxmq.lock.key", key)))
}

// deferral is how long a delivery that found its key held (err) waits:
// RetryDelay, or twice what it waited since its last deferral, and never
// longer than the holder's remaining TTL (MaxLockTTL for a key without
// one, which this package never sets). The wait comes from the delivery's
// headers (Delivery.SinceDeferred), so whatever they say, the result stays
// within these bounds.
func (m *lockMiddleware) deferral(d *inboxtype.Delivery, err error, now time.Time) time.Duration {
	delay := max(m.opts.RetryDelay, 2*min(d.SinceDeferred(ReasonLockUnavailable, now), MaxLockTTL))
	if held, ok := errors.AsType[*lock.HeldError](err); ok && held.TTL > 0 {
		return min(delay, held.TTL)
	}
	return min(delay, MaxLockTTL)
}

// runLocked runs next under l, then releases l.
func (m *lockMiddleware) runLocked(ctx context.Context, d *inboxtype.Delivery, l *lock.Lock, next inboxtype.DeliveryHandler) error {
	kctx, stop := l.KeepAlive(ctx, max(m.opts.MaxHold, 0), m.opts.CallTimeout)
	err := next(kctx, d)
	stop()
	cause := context.Cause(kctx)

	// Release even when ctx has ended; compare-and-delete never touches a
	// successor's lock.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.opts.CallTimeout)
	rerr := l.Release(rctx)
	cancel()
	if rerr != nil && !errors.Is(rerr, lock.ErrNotHeld) {
		// The lock expires by its TTL; later deliveries of the key wait.
		m.health.set(true, rerr)
	}

	if !errors.Is(cause, lock.ErrLockLost) && !errors.Is(cause, lock.ErrMaxHoldReached) {
		return err
	}
	d.Transition(inboxtype.StatusLockExpired, cause)
	if err == nil || errors.Is(err, retry.ErrDuplicate) {
		// Committed (or already done) before the loss mattered.
		return err
	}
	return retry.WithReason(ReasonLockExpired, retry.Retryable(
		fmt.Errorf("middleware: lock %q lost before completion: %w", l.Key(), errors.Join(cause, err))))
}
