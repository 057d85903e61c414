package outboxwire

import (
	"context"
	"sync/atomic"
)

// WakeLocally returns a context for one unit of work (one delivery: its
// transaction, however many times it runs) whose enqueues send no NOTIFY,
// and done, which calls wake if anything was enqueued under that context
// (or one derived from it). Call done once the work's transaction has
// ended, committed or not.
func WakeLocally(ctx context.Context, wake func()) (_ context.Context, done func()) {
	lw := &localWake{wake: wake}
	return context.WithValue(ctx, localWakeKey{}, lw), lw.done
}

type localWakeKey struct{}

// localWake is WakeLocally's record of one unit of work.
type localWake struct {
	wake   func()
	queued atomic.Bool // rows were enqueued: done wakes the relay
}

func (lw *localWake) done() {
	if lw.queued.Load() {
		lw.wake()
	}
}

// SkipNotify reports whether ctx comes from WakeLocally, and records that
// rows are enqueued under it: the enqueue then leaves its NOTIFY out.
func SkipNotify(ctx context.Context) bool {
	lw, _ := ctx.Value(localWakeKey{}).(*localWake)
	if lw == nil {
		return false
	}
	lw.queued.Store(true)
	return true
}
