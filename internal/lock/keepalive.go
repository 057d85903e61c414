package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// DefaultMaxHold is the default of KeepAliveOpts.MaxHold. It stays below
// RabbitMQ's default consumer ack timeout (30 minutes), so a stuck handler
// loses its lock, and gives up its delivery, before the broker closes the
// channel under it.
const DefaultMaxHold = 25 * time.Minute

// KeepAliveOpts configure [Lock.KeepAlive]. A nil *KeepAliveOpts means
// defaults.
type KeepAliveOpts struct {
	// TTL is the TTL each refresh sets. Defaults to the TTL the lock was
	// obtained with.
	TTL time.Duration
	// Interval is the time between refreshes. Defaults to TTL/3, so two
	// refreshes in a row may fail before the lock runs out. A lock obtained
	// with a shorter lease (Config.Lease) is first refreshed within a third
	// of its lease.
	Interval time.Duration
	// MaxHold caps the total time the lock is held, counted from
	// [Lock.ObtainedAt]; when it is reached the context is cancelled with
	// [ErrMaxHoldReached] and refreshing stops. Defaults to DefaultMaxHold
	// (25m); -1 means no cap.
	MaxHold time.Duration
	// CallTimeout bounds each refresh call. Defaults to Interval/2.
	CallTimeout time.Duration
}

func (o *KeepAliveOpts) withDefaults(lockTTL time.Duration) KeepAliveOpts {
	var out KeepAliveOpts
	if o != nil {
		out = *o
	}
	if out.TTL <= 0 {
		out.TTL = lockTTL
	}
	if out.Interval <= 0 {
		out.Interval = max(out.TTL/3, time.Millisecond)
	}
	if out.MaxHold == 0 {
		out.MaxHold = DefaultMaxHold
	}
	if out.CallTimeout <= 0 {
		out.CallTimeout = max(out.Interval/2, time.Millisecond)
	}
	return out
}

// KeepAlive refreshes the lock in the background every Interval, until stop
// is called, ctx ends, or the lock is lost. It returns a context derived
// from ctx for the work the lock protects; that context is cancelled with
// cause:
//
//   - [ErrLockLost] (wrapping the last error) when a refresh finds the token
//     gone, or when no refresh succeeded before the lock's TTL ran out
//     (Redis down or partitioned): another worker may hold the lock now;
//   - [ErrMaxHoldReached] when the lock has been held for MaxHold;
//   - context.Canceled when stop is called.
//
// stop ends the refresher and waits for a refresh under way to return; it
// does not release the lock (call [Lock.Release]) and is safe to call more
// than once. Call stop before reading context.Cause of the returned context
// to get a settled answer.
//
// The refresher is a timer, not a goroutine: most holders release the lock
// long before the first refresh is due, and a timer costs them less than a
// goroutine with timers of its own.
func (l *Lock) KeepAlive(ctx context.Context, opts *KeepAliveOpts) (context.Context, func()) {
	o := opts.withDefaults(l.ttl)
	kctx, cancel := context.WithCancelCause(ctx)
	// The lock is known to live until expires: the start of the last
	// successful SET or PEXPIRE plus the TTL it set (life).
	k := &keeper{l: l, o: o, ctx: kctx, cancel: cancel, life: l.lease, expires: l.obtainedAt.Add(l.lease)}
	if o.MaxHold > 0 {
		k.capAt = l.obtainedAt.Add(o.MaxHold)
	}
	k.mu.Lock()
	k.t = time.AfterFunc(k.next(), k.fire)
	k.mu.Unlock()
	return kctx, k.stop
}

// keeper is one KeepAlive's refresher.
type keeper struct {
	l      *Lock
	o      KeepAliveOpts
	ctx    context.Context //nolint:containedctx // the protected work's context, under which refreshes run
	cancel context.CancelCauseFunc
	capAt  time.Time // zero: no MaxHold

	// life and expires are touched by the timer's function only (one
	// firing at a time: the next is scheduled at its end).
	life    time.Duration
	expires time.Time

	mu      sync.Mutex
	t       *time.Timer
	stopped bool
	running sync.WaitGroup // the timer's function under way
}

// next is the delay to the next firing: every Interval, at least three
// times per life (so a lock obtained with a short lease, Config.Lease, is
// extended in time), no later than the lock expires, and at the cap.
func (k *keeper) next() time.Duration {
	d := min(k.o.Interval, max(k.life/3, time.Millisecond), time.Until(k.expires))
	if !k.capAt.IsZero() {
		d = min(d, time.Until(k.capAt))
	}
	return max(d, 0)
}

// fire is the timer's function: it ends the hold at the cap, or refreshes
// the lock and schedules the next firing.
func (k *keeper) fire() {
	k.mu.Lock()
	if k.stopped || k.ctx.Err() != nil {
		k.mu.Unlock()
		return
	}
	k.running.Add(1)
	k.mu.Unlock()
	defer k.running.Done()

	if !k.capAt.IsZero() && !time.Now().Before(k.capAt) {
		k.cancel(ErrMaxHoldReached)
		return
	}
	// Refresh even when the estimated expiry has passed (a late timer on
	// a busy machine): if the token is still there, no one else can have
	// taken the lock meanwhile.
	start := time.Now()
	rctx, rcancel := context.WithTimeout(k.ctx, k.o.CallTimeout)
	err := k.l.Refresh(rctx, k.o.TTL)
	rcancel()
	switch {
	case err == nil:
		k.life, k.expires = k.o.TTL, start.Add(k.o.TTL)
	case errors.Is(err, ErrNotHeld):
		k.cancel(fmt.Errorf("%w: %w", ErrLockLost, err))
		return
	case k.ctx.Err() != nil:
		return
	case !time.Now().Before(k.expires):
		// Redis stayed silent until the lock ran out: another worker
		// may hold it now.
		k.cancel(fmt.Errorf("%w: ttl ran out without a successful refresh: %w", ErrLockLost, err))
		return
	}
	// On a Redis error, try again at the next interval, and at the latest
	// when the lock runs out.
	k.mu.Lock()
	if !k.stopped {
		k.t.Reset(k.next())
	}
	k.mu.Unlock()
}

// stop ends the refresher and waits for a refresh under way.
func (k *keeper) stop() {
	k.cancel(context.Canceled)
	k.mu.Lock()
	k.stopped = true
	k.t.Stop()
	k.mu.Unlock()
	k.running.Wait()
}
