package lock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// KeepAlive refreshes the lock in the background until stop is called, ctx
// ends, or the lock is lost, and returns a context for the work the lock
// protects. The first refresh comes within a third of the obtain's lease,
// the next ones every third of the lock's ttl, each bounded by callTimeout
// (0: a sixth of the ttl). The context is cancelled with cause:
//
//   - [ErrLockLost] (wrapping the last error) when a refresh finds the
//     token gone, or when no refresh succeeded before the lock ran out
//     (Redis down or partitioned): another may hold the lock now;
//   - [ErrMaxHoldReached] once the lock has been held for maxHold,
//     counted from the obtain (0: no cap);
//   - context.Canceled when stop is called.
//
// stop ends the refresher and waits for a refresh under way; it does not
// release the lock, and it is safe to call more than once. Read
// context.Cause of the returned context after stop for a settled answer.
func (l *Lock) KeepAlive(ctx context.Context, maxHold, callTimeout time.Duration) (context.Context, func()) {
	kctx, cancel := context.WithCancelCause(ctx)
	if callTimeout <= 0 {
		callTimeout = l.ttl / 6
	}
	var capAt time.Time
	if maxHold > 0 {
		capAt = l.obtainedAt.Add(maxHold)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The lock lives at least until expires: the sending of the last
		// successful SET or PEXPIRE plus the time to live it set (life).
		life, expires := l.lease, l.obtainedAt.Add(l.lease)
		next := func() time.Duration {
			d := min(max(life/3, time.Millisecond), time.Until(expires))
			if !capAt.IsZero() {
				d = min(d, time.Until(capAt))
			}
			return max(d, 0)
		}
		t := time.NewTimer(next())
		defer t.Stop()
		for {
			select {
			case <-kctx.Done():
				return
			case <-t.C:
			}
			if !capAt.IsZero() && !time.Now().Before(capAt) {
				cancel(ErrMaxHoldReached)
				return
			}
			// Refresh even when the estimated expiry has passed (a late
			// timer): while the token is there, no one else has the lock.
			start := time.Now()
			rctx, rcancel := context.WithTimeout(kctx, callTimeout)
			err := l.Refresh(rctx)
			rcancel()
			switch {
			case err == nil:
				life, expires = l.ttl, start.Add(l.ttl)
			case errors.Is(err, ErrNotHeld):
				cancel(fmt.Errorf("%w: %w", ErrLockLost, err))
				return
			case kctx.Err() != nil:
				return
			case !time.Now().Before(expires):
				cancel(fmt.Errorf("%w: ttl ran out without a successful refresh: %w", ErrLockLost, err))
				return
			}
			// After a Redis error, try again in time: before the lock
			// runs out.
			t.Reset(next())
		}
	}()
	return kctx, func() {
		cancel(context.Canceled)
		<-done
	}
}
