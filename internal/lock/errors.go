package lock

import (
	"errors"
	"strconv"
	"time"
)

var (
	// ErrNotObtained is returned by [Locker.Obtain] when another holder has
	// the lock (after retrying within ObtainOpts.Wait). The error returned
	// is a [*HeldError], which matches ErrNotObtained with errors.Is and
	// tells how long the holder's lock still lives.
	ErrNotObtained = errors.New("lock: not obtained")

	// ErrNotHeld is returned by [Lock.Refresh], [Lock.Release] and
	// [Lock.TTL] when the key no longer holds the lock's token: the lock
	// expired, was released, or now belongs to another holder.
	ErrNotHeld = errors.New("lock: not held")

	// ErrLockLost is the cause with which a [Lock.KeepAlive] context is
	// cancelled when a refresh finds the lock gone, or when Redis did not
	// answer before the lock's TTL ran out. Test it with
	// errors.Is(context.Cause(ctx), ErrLockLost).
	ErrLockLost = errors.New("lock: lost")

	// ErrMaxHoldReached is the cause with which a [Lock.KeepAlive] context
	// is cancelled when the lock has been held for KeepAliveOpts.MaxHold.
	ErrMaxHoldReached = errors.New("lock: maximum hold reached")
)

// HeldError is the error of an obtain that found the lock held by another
// holder. errors.Is(err, ErrNotObtained) reports true for it; errors.As
// gives the holder's remaining time to live, so a caller can come back
// when the lock is due to expire instead of at a fixed interval.
type HeldError struct {
	// Key is the name of the lock.
	Key string
	// TTL is the holder's remaining time to live when the obtain ran (the
	// holder may still refresh or release it). Zero means the key has no
	// expiry: it was not set by this package.
	TTL time.Duration
}

func newHeldError(key string, answer int64) *HeldError {
	return &HeldError{Key: key, TTL: time.Duration(-answer) * time.Millisecond}
}

func (e *HeldError) Error() string {
	if e.TTL == 0 {
		return "lock: not obtained: " + strconv.Quote(e.Key) + " is held by another, without expiry"
	}
	return "lock: not obtained: " + strconv.Quote(e.Key) + " is held by another for " + e.TTL.String()
}

// Is reports whether target is ErrNotObtained.
func (e *HeldError) Is(target error) bool { return target == ErrNotObtained }
