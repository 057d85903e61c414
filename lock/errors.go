package lock

import "errors"

var (
	// ErrNotObtained is returned by [Locker.Obtain] when another holder has
	// the lock (after retrying within ObtainOpts.Wait).
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
