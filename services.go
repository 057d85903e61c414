package inboxmq

import (
	"context"
	"sync"

	"github.com/inboxmq/inboxmq/observe"
)

// service is a background part of the worker with the lifecycle every
// part will share: Start returns once it runs, Stop ends it within ctx.
type service interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// The two adapters below give the parts that do not have Start/Stop yet
// that shape. They go once observe.Server and inbox.Reconciler do.

// serverService adapts observe.Server (Start/Shutdown).
type serverService struct{ *observe.Server }

func (s serverService) Stop(ctx context.Context) error { return s.Shutdown(ctx) }

// runService adapts a Run(ctx) loop (inbox.Reconciler): Start runs it in a
// goroutine until Stop cancels its context and waits for it.
type runService struct {
	run func(ctx context.Context) error

	once   sync.Once
	cancel context.CancelFunc
	done   chan struct{}
}

func (s *runService) Start(ctx context.Context) error {
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel, s.done = cancel, make(chan struct{})
	go func() {
		defer close(s.done)
		_ = s.run(rctx)
	}()
	return nil
}

func (s *runService) Stop(ctx context.Context) error {
	if s.cancel == nil {
		return nil
	}
	s.once.Do(s.cancel)
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
