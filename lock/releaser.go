package lock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// PipelineClient is the client a [Releaser] needs: script evaluation and
// pipelines. Every redis.UniversalClient satisfies it.
type PipelineClient interface {
	Client
	Pipeline() redis.Pipeliner
}

// ReleaserOpts configure a [Releaser]. A nil *ReleaserOpts means defaults.
type ReleaserOpts struct {
	// RoundTimeout bounds each shared round trip, whichever caller sends
	// it. Defaults to 1s.
	RoundTimeout time.Duration
}

// Releaser releases locks of many goroutines in shared round trips. A
// worker pool that releases a lock per job spends a Redis round trip on
// each; through a Releaser, the releases that arrive while one round trip
// is under way go out together in the next, as one pipeline of
// compare-and-delete scripts. Nothing waits to fill a batch: a release
// that finds no round trip under way is sent at once, alone.
//
// The caller that sends a round trip sends one: if more releases queued
// meanwhile, the first of their callers sends the next, so no caller works
// for the others for long, and each round trip has its own RoundTimeout.
//
// Each release keeps the semantics of [Lock.Release]: compare-and-delete,
// [ErrNotHeld] when the lock was gone, and Release returns once its own
// answer is in. A Releaser holds no goroutine; the zero value is not
// usable (see [NewReleaser]). It is safe for concurrent use.
type Releaser struct {
	client  PipelineClient
	timeout time.Duration

	mu    sync.Mutex
	queue []*release
	busy  bool // a round trip is being sent
}

type release struct {
	lock *Lock
	err  error
	lead bool          // woken to send the next round trip
	done chan struct{} // one signal per wake-up: answered, or lead
}

// NewReleaser returns a Releaser sending through client, which must be the
// client of the locks' Locker (the same Redis deployment).
func NewReleaser(client PipelineClient, opts *ReleaserOpts) (*Releaser, error) {
	if client == nil {
		return nil, errors.New("lock: nil client")
	}
	timeout := time.Second
	if opts != nil && opts.RoundTimeout > 0 {
		timeout = opts.RoundTimeout
	}
	return &Releaser{client: client, timeout: timeout}, nil
}

// Release deletes l by compare-and-delete, like [Lock.Release], sharing
// the round trip with releases of other goroutines where they coincide.
// ctx bounds the wait for a shared round trip: a release that ctx gives up
// on before it was sent is not sent (the lock then expires by its TTL).
func (r *Releaser) Release(ctx context.Context, l *Lock) error {
	if l == nil {
		return errors.New("lock: release of a nil lock")
	}
	rel := &release{lock: l, done: make(chan struct{}, 1)}
	r.mu.Lock()
	r.queue = append(r.queue, rel)
	if r.busy {
		r.mu.Unlock()
		if err := r.wait(ctx, rel); err != nil || !rel.lead {
			return cmpErr(err, rel.err)
		}
		r.mu.Lock() // handed the next round trip
	}
	r.busy = true
	batch := r.queue
	r.queue = nil
	r.mu.Unlock()

	r.send(batch)

	r.mu.Lock()
	if len(r.queue) > 0 {
		next := r.queue[0]
		next.lead = true
		next.done <- struct{}{}
	} else {
		r.busy = false
	}
	r.mu.Unlock()
	return rel.err
}

// wait waits until rel is answered or handed the next round trip. If ctx
// ends first and rel is still queued, it is withdrawn; once it is in a
// round trip (or handed one) the wait goes on, bounded by RoundTimeout.
func (r *Releaser) wait(ctx context.Context, rel *release) error {
	select {
	case <-rel.done:
		return nil
	case <-ctx.Done():
	}
	r.mu.Lock()
	if i := slices.Index(r.queue, rel); i > 0 || (i == 0 && !rel.lead) {
		r.queue = slices.Delete(r.queue, i, i+1)
		r.mu.Unlock()
		return joinCtx(ctx, fmt.Errorf("lock: release %q: not sent", rel.lock.key))
	}
	r.mu.Unlock()
	<-rel.done
	return nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// send releases batch in one round trip (a pipeline) and answers each. A
// script the server does not have cached (NOSCRIPT: a restarted or flushed
// Redis) is retried on its own with the script's source.
func (r *Releaser) send(batch []*release) {
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	answer := func(rel *release, err error) {
		rel.err, rel.lead = err, false
		rel.done <- struct{}{}
	}
	if len(batch) == 1 {
		answer(batch[0], batch[0].lock.Release(ctx))
		return
	}
	pipe := r.client.Pipeline()
	cmds := make([]*redis.Cmd, len(batch))
	for i, rel := range batch {
		cmds[i] = releaseScript.EvalSha(ctx, pipe, []string{rel.lock.lockKey}, rel.lock.token)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	for i, rel := range batch {
		n, err := cmds[i].Int64()
		switch {
		case err != nil && redis.HasErrorPrefix(err, "NOSCRIPT"):
			err = rel.lock.Release(ctx)
		case err != nil:
			err = joinCtx(ctx, fmt.Errorf("lock: release %q: %w", rel.lock.key, err))
		case n != 1:
			err = ErrNotHeld
		}
		answer(rel, err)
	}
}
