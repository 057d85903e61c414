package redistest

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Flaky wraps a client to inject faults into the commands inboxmq's lock and
// completed-cache use (EVAL, EVALSHA, GET, MGET, SET, and pipelines): with Fail
// set they return an error at once (connection refused), with Hang set they
// block until the call's context ends (a Redis that does not answer); the
// commands never reach Redis (for a hang whose commands run later, see
// [Proxy]). Calls counts the round trips attempted. Other commands pass
// through.
type Flaky struct {
	redis.UniversalClient
	Fail  atomic.Bool
	Hang  atomic.Bool
	Calls atomic.Int64
}

// NewFlaky wraps c.
func NewFlaky(c redis.UniversalClient) *Flaky { return &Flaky{UniversalClient: c} }

func (c *Flaky) fault(ctx context.Context) error {
	c.Calls.Add(1)
	if c.Hang.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	if c.Fail.Load() {
		return errors.New("flaky: connection refused")
	}
	return nil
}

// EvalSha fails, hangs or passes through.
func (c *Flaky) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	if err := c.fault(ctx); err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	return c.UniversalClient.EvalSha(ctx, sha1, keys, args...)
}

// Eval fails, hangs or passes through.
func (c *Flaky) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	if err := c.fault(ctx); err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	return c.UniversalClient.Eval(ctx, script, keys, args...)
}

// Get fails, hangs or passes through.
func (c *Flaky) Get(ctx context.Context, key string) *redis.StringCmd {
	if err := c.fault(ctx); err != nil {
		cmd := redis.NewStringCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	return c.UniversalClient.Get(ctx, key)
}

// MGet fails, hangs or passes through.
func (c *Flaky) MGet(ctx context.Context, keys ...string) *redis.SliceCmd {
	if err := c.fault(ctx); err != nil {
		cmd := redis.NewSliceCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	return c.UniversalClient.MGet(ctx, keys...)
}

// Set fails, hangs or passes through.
func (c *Flaky) Set(ctx context.Context, key string, value any, expiration time.Duration) *redis.StatusCmd {
	if err := c.fault(ctx); err != nil {
		cmd := redis.NewStatusCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	return c.UniversalClient.Set(ctx, key, value, expiration)
}

// Pipeline returns a pipeline whose Exec fails, hangs or passes through
// as one call (one round trip), like a single command.
func (c *Flaky) Pipeline() redis.Pipeliner {
	return flakyPipe{Pipeliner: c.UniversalClient.Pipeline(), c: c}
}

type flakyPipe struct {
	redis.Pipeliner
	c *Flaky
}

func (p flakyPipe) Exec(ctx context.Context) ([]redis.Cmder, error) {
	if err := p.c.fault(ctx); err != nil {
		cmds := p.Cmds()
		for _, cmd := range cmds {
			cmd.SetErr(err)
		}
		p.Discard()
		return cmds, err
	}
	return p.Pipeliner.Exec(ctx)
}
