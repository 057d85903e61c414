package redistest

import (
	"context"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Trips is a go-redis hook that counts a client's round trips: each
// command sent alone, and each pipeline. Add it with client.AddHook.
type Trips struct{ N atomic.Int64 }

// DialHook passes dials through.
func (t *Trips) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook counts a command sent alone.
func (t *Trips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		t.N.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook counts a pipeline once.
func (t *Trips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		t.N.Add(1)
		return next(ctx, cmds)
	}
}
