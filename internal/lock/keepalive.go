package lock

import (
	"context"
	"errors"
	"fmt"
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
// stop ends the refresher and waits for its goroutine to exit; it does not
// release the lock (call [Lock.Release]) and is safe to call more than once.
// Call stop before reading context.Cause of the returned context to get a
// settled answer.
func (l *Lock) KeepAlive(ctx context.Context, opts *KeepAliveOpts) (context.Context, func()) {
	o := opts.withDefaults(l.ttl)
	kctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.keepAlive(kctx, cancel, o)
	}()
	stop := func() {
		cancel(context.Canceled)
		<-done
	}
	return kctx, stop
}

func (l *Lock) keepAlive(ctx context.Context, cancel context.CancelCauseFunc, o KeepAliveOpts) {
	// The lock is known to live until expires: the start of the last
	// successful SET or PEXPIRE plus the TTL it set (life). Refreshes come
	// every Interval, and at least three times per life, so a lock obtained
	// with a short lease (Config.Lease) is extended in time.
	life := l.lease
	expires := l.obtainedAt.Add(life)
	next := func() time.Duration {
		return max(min(o.Interval, max(life/3, time.Millisecond), time.Until(expires)), 0)
	}

	var capC <-chan time.Time
	if o.MaxHold > 0 {
		capTimer := time.NewTimer(time.Until(l.obtainedAt.Add(o.MaxHold)))
		defer capTimer.Stop()
		capC = capTimer.C
	}
	tick := time.NewTimer(next())
	defer tick.Stop()

	for {
		select {
		case <-ctx.Done():
			return
		case <-capC:
			cancel(ErrMaxHoldReached)
			return
		case <-tick.C:
		}

		// Refresh even when the estimated expiry has passed (a late timer on
		// a busy machine): if the token is still there, no one else can have
		// taken the lock meanwhile.
		start := time.Now()
		rctx, rcancel := context.WithTimeout(ctx, o.CallTimeout)
		err := l.Refresh(rctx, o.TTL)
		rcancel()
		switch {
		case err == nil:
			life, expires = o.TTL, start.Add(o.TTL)
		case errors.Is(err, ErrNotHeld):
			cancel(fmt.Errorf("%w: %w", ErrLockLost, err))
			return
		case ctx.Err() != nil:
			return
		case !time.Now().Before(expires):
			// Redis stayed silent until the lock ran out: another worker
			// may hold it now.
			cancel(fmt.Errorf("%w: ttl ran out without a successful refresh: %w", ErrLockLost, err))
			return
		}
		// On a Redis error, try again at the next interval, and at the
		// latest when the lock runs out.
		tick.Reset(next())
	}
}
