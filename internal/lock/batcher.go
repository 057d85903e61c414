package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inboxmq/inboxmq/internal/combine"
)

// PipelineClient is the client a [Batcher] needs: script evaluation and
// pipelines. Every redis.UniversalClient satisfies it.
type PipelineClient interface {
	Client
	Pipeline() redis.Pipeliner
}

// BatcherOpts configure a [Batcher]. A nil *BatcherOpts means defaults.
type BatcherOpts struct {
	// RoundTimeout bounds each shared round trip, whichever caller sends
	// it. Defaults to 1s.
	RoundTimeout time.Duration
}

// Batcher obtains and releases the locks of many goroutines in shared
// round trips. A worker pool that takes a lock per job spends two Redis
// round trips on each (obtain, release); through a Batcher, the obtains
// and releases that arrive while one round trip is under way go out
// together in the next, as one pipeline of scripts. Nothing waits to fill
// a batch: an operation that finds no round trip under way is sent at
// once, alone.
//
// The caller that sends a round trip sends one: if more operations queued
// meanwhile, the first of their callers sends the next, so no caller works
// for the others for long, and each round trip has its own RoundTimeout
// (internal/combine).
//
// Each operation keeps its own semantics: [Batcher.Obtain] is a single
// attempt of [Locker.Obtain] (SET NX PX and the fencing counter in one
// script), [Batcher.Release] is [Lock.Release] (compare-and-delete), and
// their marked variants [Batcher.ObtainUnlessMarked] and
// [Batcher.ReleaseAndMark] add a look at, or a write of, a [Mark] in the
// same script; each caller returns once its own answer is in. A Batcher holds no goroutine;
// the zero value is not usable (see [NewBatcher]). It is safe for
// concurrent use.
//
// # Calls without an answer
//
// A command whose answer did not come in time (Redis hung, the network
// dropped) may have run, or may still run when Redis is reachable again:
// an obtain the caller gave up on would then leave a lock that nobody
// releases. The Batcher remembers the token of each such obtain, and of
// each release that got no answer, and releases them by compare-and-delete
// in its next round trips, until Redis answers for each. This is best
// effort, for a bounded number of locks: one that is forgotten, or whose
// obtain runs after its release, lives for its lease (Config.Lease) or
// its TTL.
type Batcher struct {
	locker  *Locker
	client  PipelineClient
	timeout time.Duration
	rounds  *combine.Combiner[*op]

	mu sync.Mutex
	// unsettled are locks that may be set in Redis with nobody to release
	// them: obtains and releases that got no answer. Oldest first.
	unsettled []*Lock
}

// Bounds of the unsettled locks a Batcher keeps, and releases per round.
const (
	maxUnsettled      = 1024
	unsettledPerRound = 128
)

// op is one obtain (lock nil until answered) or release, with or without
// a mark.
type op struct {
	release    bool
	key, token string // obtain: the request; its answer is lock
	ttl        time.Duration
	mark       *Mark // obtain: skip when marked; release: write it
	lock       *Lock
	err        error
}

// script returns the script that runs o, and its keys and arguments.
func (b *Batcher) script(o *op) (*redis.Script, []string, []any) {
	if o.release {
		if o.mark != nil {
			return releaseAndMarkScript, []string{o.lock.lockKey, o.mark.Key},
				[]any{o.lock.token, o.mark.Value, o.mark.TTL.Milliseconds()}
		}
		return releaseScript, []string{o.lock.lockKey}, []any{o.lock.token}
	}
	lockKey, fenceKey := RedisKeys(o.key)
	lease := b.locker.cfg.lease(o.ttl)
	keys := []string{lockKey, fenceKey}
	args := []any{o.token, lease.Milliseconds(), b.locker.fenceTTLMillis()}
	if o.mark != nil {
		return obtainUnlessMarkedScript, append(keys, o.mark.Key), append(args, o.mark.Value)
	}
	return obtainScript, keys, args
}

// answer reads cmd, o's answer to a script sent at sent, into o.
func (b *Batcher) answer(ctx context.Context, o *op, sent time.Time, cmd *redis.Cmd) {
	if o.release {
		o.err = b.released(ctx, o.lock, cmd)
		return
	}
	o.err = b.obtained(ctx, o, sent, cmd)
}

// NewBatcher returns a Batcher for l's locks. l's client must support
// pipelines ([PipelineClient]), as every redis.UniversalClient does.
func NewBatcher(l *Locker, opts *BatcherOpts) (*Batcher, error) {
	if l == nil {
		return nil, errors.New("lock: nil locker")
	}
	client, ok := l.client.(PipelineClient)
	if !ok {
		return nil, fmt.Errorf("lock: a Batcher needs a client with pipelines, got %T", l.client)
	}
	timeout := time.Second
	if opts != nil && opts.RoundTimeout > 0 {
		timeout = opts.RoundTimeout
	}
	b := &Batcher{locker: l, client: client, timeout: timeout}
	b.rounds = combine.New(b.send, nil)
	return b, nil
}

// Obtain makes one attempt to take the lock named key for ttl, like
// [Locker.Obtain] with no Wait, sharing the round trip with other
// goroutines' obtains and releases where they coincide. It returns a
// [*HeldError] (errors.Is [ErrNotObtained]) when another holder has the
// lock. ctx bounds the wait
// for a shared round trip: an obtain whose ctx ends before it was sent
// (or had ended already) is not sent.
func (b *Batcher) Obtain(ctx context.Context, key string, ttl time.Duration) (*Lock, error) {
	token, err := obtainToken(key, ttl)
	if err != nil {
		return nil, err
	}
	o := &op{key: key, token: token, ttl: ttl}
	if err := b.do(ctx, o); err != nil {
		return nil, err
	}
	return o.lock, o.err
}

// Release deletes l by compare-and-delete, like [Lock.Release], sharing
// the round trip with other goroutines' obtains and releases where they
// coincide. ctx bounds the wait for a shared round trip: a release whose
// ctx ends before it was sent (or had ended already) is not sent now: like
// a release that got no answer, it goes out with a later round trip.
func (b *Batcher) Release(ctx context.Context, l *Lock) error {
	if l == nil {
		return errors.New("lock: release of a nil lock")
	}
	o := &op{release: true, key: l.key, lock: l}
	if err := b.do(ctx, o); err != nil {
		b.unsettle(l) // not sent: a later round releases it
		return err
	}
	return o.err
}

// do runs o in a shared round trip. The error is do's own (ctx ended
// before o was sent, or the round failed); o.err is o's answer.
func (b *Batcher) do(ctx context.Context, o *op) error {
	err := b.rounds.Do(ctx, o)
	if err != nil && errors.Is(err, ctx.Err()) {
		verb := "obtain"
		if o.release {
			verb = "release"
		}
		return joinCtx(ctx, fmt.Errorf("lock: %s %q: not sent", verb, o.key))
	}
	return err
}

// send runs batch in one round trip (a pipeline), with the releases of
// unsettled locks, and answers each operation. A script the server does
// not have cached (NOSCRIPT: a restarted or flushed Redis) is retried on
// its own with the script's source.
func (b *Batcher) send(batch []*op) {
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	unsettled := b.takeUnsettled()
	if len(batch) == 1 && len(unsettled) == 0 {
		o := batch[0]
		sent := time.Now()
		script, keys, args := b.script(o)
		b.answer(ctx, o, sent, script.Run(ctx, b.client, keys, args...))
		return
	}
	pipe := b.client.Pipeline()
	cmds := make([]*redis.Cmd, len(batch))
	for i, o := range batch {
		script, keys, args := b.script(o)
		cmds[i] = script.EvalSha(ctx, pipe, keys, args...)
	}
	extra := make([]*redis.Cmd, len(unsettled))
	for i, l := range unsettled {
		extra[i] = releaseScript.EvalSha(ctx, pipe, []string{l.lockKey}, l.token)
	}
	sent := time.Now()    // no lock of this round can have been set earlier
	_, _ = pipe.Exec(ctx) // each command carries its own error
	for i, o := range batch {
		cmd, at := cmds[i], sent
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			at = time.Now()
			script, keys, args := b.script(o)
			cmd = script.Run(ctx, b.client, keys, args...)
		}
		b.answer(ctx, o, at, cmd)
	}
	for i, l := range unsettled {
		cmd := extra[i]
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			cmd = l.release(ctx)
		}
		_ = b.released(ctx, l, cmd)
	}
}

// unsettle remembers l for release in a later round, dropping the oldest
// beyond maxUnsettled.
func (b *Batcher) unsettle(l *Lock) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.unsettled = append(b.unsettled, l)
	if n := len(b.unsettled) - maxUnsettled; n > 0 {
		b.unsettled = append(b.unsettled[:0], b.unsettled[n:]...)
	}
}

// takeUnsettled removes the oldest unsettled locks for this round.
func (b *Batcher) takeUnsettled() []*Lock {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := min(len(b.unsettled), unsettledPerRound)
	if n == 0 {
		return nil
	}
	out := append([]*Lock(nil), b.unsettled[:n]...)
	b.unsettled = append(b.unsettled[:0], b.unsettled[n:]...)
	return out
}

// Unsettled reports how many locks the Batcher still has to release
// because a call about them got no answer (see the type's documentation).
func (b *Batcher) Unsettled() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.unsettled)
}

// answered reports whether err is nil or Redis's own answer (an error
// reply): the command ran, or never will. Any other error (a timeout, a
// broken connection) leaves that open.
func answered(err error) bool {
	var reply redis.Error
	return err == nil || errors.As(err, &reply)
}

// obtained reads an obtain script's answer into o.lock: the lock, sent
// at sent, a *HeldError, or ErrMarked. An obtain without an answer is
// unsettled.
func (b *Batcher) obtained(ctx context.Context, o *op, sent time.Time, cmd *redis.Cmd) error {
	val, err := cmd.Result()
	if err != nil {
		if !answered(err) {
			b.unsettle(b.locker.newLock(o.key, o.token, 0, o.ttl, sent))
		}
		return joinCtx(ctx, fmt.Errorf("lock: obtain %q: %w", o.key, err))
	}
	fence, ok := val.(int64)
	switch {
	case val == markedReply:
		return ErrMarked
	case !ok:
		return fmt.Errorf("lock: obtain %q: unexpected answer %v", o.key, val)
	case fence <= 0:
		return newHeldError(o.key, fence)
	}
	o.lock = b.locker.newLock(o.key, o.token, fence, o.ttl, sent)
	return nil
}

// released reads a release script's answer; a release without an answer
// is unsettled.
func (b *Batcher) released(ctx context.Context, l *Lock, cmd *redis.Cmd) error {
	if !answered(cmd.Err()) {
		b.unsettle(l)
	}
	return releasedAnswer(ctx, l, cmd)
}

// releasedAnswer reads a release script's answer.
func releasedAnswer(ctx context.Context, l *Lock, cmd *redis.Cmd) error {
	n, err := cmd.Int64()
	if err != nil {
		return joinCtx(ctx, fmt.Errorf("lock: release %q: %w", l.key, err))
	}
	if n != 1 {
		return ErrNotHeld
	}
	return nil
}
