// Package lock is a small lock on Redis with a fencing counter and a
// keep-alive: the machinery of middleware.Lock.
//
// [Obtain] sets the key to a random token if it is absent (SET NX PX) and
// increments the key's fencing counter in the same script; it answers a
// [*HeldError] (errors.Is [ErrNotObtained]) with the holder's remaining
// time to live when another holds it. [Lock.Release] and [Lock.Refresh]
// compare the token before they delete or extend, so a holder whose lock
// expired never touches its successor's ([ErrNotHeld]). [Lock.KeepAlive]
// refreshes the lock while work runs and cancels the work's context when
// the lock is lost or held too long:
//
//	l, err := lock.Obtain(ctx, rdb, "payment:42", 30*time.Second, 5*time.Second)
//	if errors.Is(err, lock.ErrNotObtained) {
//		return // someone else is on it
//	}
//	wctx, stop := l.KeepAlive(ctx, 25*time.Minute, 0)
//	err = work(wctx)
//	stop()
//	_ = l.Release(context.WithoutCancel(ctx))
//
// A lock in Redis is a lease and its fence is lost with it in a fail-over:
// neither may be the only thing that keeps an effect single. Both keys of
// a lock share the hash tag "{key}" ([RedisKeys]), so the scripts run on a
// Redis Cluster. An obtain that got no answer may still run when Redis
// answers; the short lease an obtain sets bounds the lock it leaves.
//
// Errors start with "lock: "; Redis failures are wrapped with %w and, when
// the caller's context ended, joined with its error. The keys and scripts
// are described in docs/internals.md.
package lock
