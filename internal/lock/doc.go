// Package lock is a small distributed lock on Redis, with fencing tokens and
// a capped keep-alive.
//
// It has a home of its own, outside the consumer and its middleware, because
// nothing in it is about deliveries: the outbox relay, the operator CLI or a
// user's cron job can take the same locks with the same guarantees, and the
// package depends on nothing of inboxmq.
//
// # Obtaining and releasing
//
// [New] wraps any redis.UniversalClient (single, Sentinel or Cluster); it
// needs only script evaluation ([Client]). [Locker.Obtain] sets the key to a
// random token if it is absent and returns [ErrNotObtained] when another
// holder has it. [Lock.Release] and [Lock.Refresh] compare the
// token before they delete or extend, so an expired holder never touches its
// successor's lock ([ErrNotHeld]).
//
//	locker, err := lock.New(rdb, nil)
//	l, err := locker.Obtain(ctx, "invoice:42", 30*time.Second, nil)
//	if errors.Is(err, lock.ErrNotObtained) {
//		return // someone else is on it
//	}
//	defer l.Release(context.WithoutCancel(ctx))
//
// # Fencing
//
// A lock in Redis is a lease: a holder that pauses past its TTL still runs
// but no longer holds it. [Lock.Fence] returns a counter that strictly
// increases with every Obtain of the key, taken atomically with the lock. Systems that accept writes from lock
// holders keep the largest fence seen and refuse smaller ones. Both keys of
// a lock share the hash tag "{key}" ([RedisKeys]), so they sit in one Redis
// Cluster slot.
//
// # Keep-alive
//
// [Lock.KeepAlive] refreshes the lock every TTL/3 for at most MaxHold
// (default 25 minutes, below RabbitMQ's consumer ack timeout) and returns a
// context for the protected work. The context is cancelled with cause
// [ErrLockLost] when the lock is gone or Redis stayed silent past the TTL,
// and with [ErrMaxHoldReached] at the cap:
//
//	ctx, stop := l.KeepAlive(ctx, nil)
//	err := work(ctx)
//	stop()
//	if errors.Is(context.Cause(ctx), lock.ErrLockLost) { … }
//
// # Shared calls
//
// A [Batcher] sends the obtains and releases of concurrent callers together
// (it needs a client with pipelines, [PipelineClient]); each keeps its own
// semantics (a single obtain attempt with its fence; a release that never
// touches a successor's lock) and its own answer, and none waits for
// others to arrive:
//
//	b, err := lock.NewBatcher(locker, nil)
//	l, err := b.Obtain(ctx, "payment:42", 30*time.Second) // or ErrNotObtained
//	err = b.Release(ctx, l)                               // nil, ErrNotHeld, or a Redis error
//
// # Marks
//
// A [Mark] is a key in the lock's hash slot ([MarkKey]) that says "this
// work is done". [Batcher.ObtainUnlessMarked] reads it in the obtain's own
// script and takes no lock when it holds the value asked for
// ([ErrMarked]); [Batcher.ReleaseAndMark] writes it in the release's
// script. A completed-cache in front of a lock thus costs no round trip of
// its own:
//
//	done := lock.Mark{Key: lock.MarkKey("done:", "payment:42"), Value: fingerprint, TTL: 24 * time.Hour}
//	l, err := b.ObtainUnlessMarked(ctx, "payment:42", 30*time.Second, done) // or ErrMarked
//	err = b.ReleaseAndMark(ctx, l, done)
//
// # Calls that got no answer
//
// A call that timed out may still run in Redis: while Redis hangs (a
// stopped process, a black-holed network, a failover under way) the
// commands already sent wait in buffers, and Redis runs them when it comes
// back, after the caller gave up. An obtain run that late sets a lock that
// nobody releases. Two things bound it. A [Batcher] remembers the token of
// every obtain and release that got no answer and releases those locks
// once Redis answers again ([Batcher.Unsettled] counts them). And with Config.Lease an obtain first
// sets a short time to live, which the keep-alive's first refresh extends
// to the full TTL: a late lock whose release is lost too (or runs before
// it) is gone after the lease.
//
// The keys, the scripts and the round trips are described in
// docs/internals.md.
//
// # Errors
//
// Errors start with "lock: ". Redis failures are wrapped with %w; when the
// caller's context ended, its error is joined (errors.Join(err, ctx.Err())).
package lock
