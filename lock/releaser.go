package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// PipelineClient is the client a [Releaser] needs: script evaluation and
// pipelines. Every redis.UniversalClient satisfies it.
type PipelineClient interface {
	Client
	Pipeline() redis.Pipeliner
}

// Releaser releases locks of many goroutines in shared round trips. A
// worker pool that releases a lock per job spends a Redis round trip on
// each; through a Releaser, the releases that arrive while one round trip
// is under way go out together in the next, as one pipeline of
// compare-and-delete scripts. Nothing waits to fill a batch: a release
// that finds no round trip under way is sent at once, alone.
//
// Each release keeps the semantics of [Lock.Release]: compare-and-delete,
// [ErrNotHeld] when the lock was gone, and Release returns once its own
// answer is in. A Releaser holds no goroutine; the zero value is not
// usable (see [NewReleaser]). It is safe for concurrent use.
type Releaser struct {
	client PipelineClient

	mu    sync.Mutex
	queue []*release
	busy  bool
}

type release struct {
	lock *Lock
	err  error
	done chan struct{}
}

// NewReleaser returns a Releaser sending through client, which must be the
// client of the locks' Locker (the same Redis deployment).
func NewReleaser(client PipelineClient) (*Releaser, error) {
	if client == nil {
		return nil, errors.New("lock: nil client")
	}
	return &Releaser{client: client}, nil
}

// Release deletes l by compare-and-delete, like [Lock.Release], sharing
// the round trip with releases of other goroutines where they coincide.
// ctx bounds this call's wait and, when this call sends the round trip,
// the round trip itself.
func (r *Releaser) Release(ctx context.Context, l *Lock) error {
	rel := &release{lock: l, done: make(chan struct{})}
	r.mu.Lock()
	r.queue = append(r.queue, rel)
	if r.busy {
		r.mu.Unlock()
		select {
		case <-rel.done:
			return rel.err
		case <-ctx.Done():
			// The queued release still goes out with the next round trip.
			return joinCtx(ctx, fmt.Errorf("lock: release %q: waiting for the shared round trip", l.key))
		}
	}
	r.busy = true
	for len(r.queue) > 0 {
		batch := r.queue
		r.queue = nil
		r.mu.Unlock()
		r.send(ctx, batch)
		r.mu.Lock()
	}
	r.busy = false
	r.mu.Unlock()
	return rel.err
}

// send releases batch in one round trip (a pipeline) and hands each its
// answer. A script the server does not have cached (NOSCRIPT: a restarted
// or flushed Redis) is retried on its own with the script's source.
func (r *Releaser) send(ctx context.Context, batch []*release) {
	if len(batch) == 1 {
		batch[0].err = batch[0].lock.Release(ctx)
		close(batch[0].done)
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
			rel.err = rel.lock.Release(ctx)
		case err != nil:
			rel.err = joinCtx(ctx, fmt.Errorf("lock: release %q: %w", rel.lock.key, err))
		case n != 1:
			rel.err = ErrNotHeld
		}
		close(rel.done)
	}
}
