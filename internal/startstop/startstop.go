// Package startstop gives every service of an inboxmq worker (the
// consumer, the control watcher, the presence heartbeat, the inbox
// retention job and reconciler, the outbox relay, the observe server) one
// lifecycle:
//
//   - Start returns once the service runs, or with the error that kept it
//     from starting. A Start while the service runs (or is still stopping)
//     is refused with [ErrAlreadyStarted]. After a stop, or a failed start,
//     the service may be started again.
//   - Stop ends the run and waits for its goroutine, bounded by ctx. It is
//     idempotent and safe without Start. If ctx ends first, Stop returns an
//     error joined with ctx.Err() and the run finishes in the background.
//   - Stopped returns a channel closed when the run has ended.
//
// A service holds a [Service] in an unexported field and delegates its
// Start, Stop and Stopped to it, so the goroutine, its cancellation, the
// stopped channel and the idempotence live here and nowhere else.
package startstop

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrAlreadyStarted is returned (wrapped, with the service's name) by a
// Start while the service runs or is still stopping.
var ErrAlreadyStarted = errors.New("already started")

// ErrStopped is the cause of the run context's cancellation when Stop
// ends the run ([context.Cause]).
var ErrStopped = errors.New("startstop: service stopped")

// closed is the channel Stopped returns before the first Start.
var closed = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// Service is the lifecycle of one background service. The zero value is
// ready to use (with an empty Name); it must not be copied after first use.
type Service struct {
	// Name prefixes the errors of Start and Stop ("control: watcher").
	Name string

	mu      sync.Mutex
	running bool                    // from Start until the run goroutine ends
	cancel  context.CancelCauseFunc // ends the start phase and the run
	stopped chan struct{}           // of the current or last run
	err     error                   // the last run's error, until a Stop returns it
}

// Start starts the service: it calls init (if not nil) with ctx, then,
// if init returned nil, calls run on a goroutine of its own and returns.
// An error of init is returned as is and the service stays stopped.
//
// ctx bounds only init. run gets a context that carries ctx's values but
// not its cancellation: it ends when Stop is called (cause [ErrStopped]),
// never because ctx ends. run should return soon after its context ends;
// its error is returned by the next Stop. A Stop during init cancels init's
// context too.
func (s *Service) Start(ctx context.Context, init, run func(context.Context) error) error {
	s.mu.Lock()
	if s.running {
		s.mu.Unlock()
		return fmt.Errorf("%s: %w", s.Name, ErrAlreadyStarted)
	}
	initCtx, cancelInit := context.WithCancelCause(ctx)
	runCtx, cancelRun := context.WithCancelCause(context.WithoutCancel(ctx))
	cancel := func(cause error) {
		cancelInit(cause)
		cancelRun(cause)
	}
	stopped := make(chan struct{})
	s.running, s.cancel, s.stopped, s.err = true, cancel, stopped, nil
	s.mu.Unlock()

	if init != nil {
		if err := init(initCtx); err != nil {
			cancel(nil)
			s.end(stopped, nil) // Start reports err; Stop has nothing to add
			return err
		}
	}
	cancelInit(nil)
	go func() {
		err := run(runCtx)
		cancel(nil)
		s.end(stopped, err)
	}()
	return nil
}

// end marks the run that owns stopped as ended.
func (s *Service) end(stopped chan struct{}, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running, s.err = false, err
	close(stopped)
}

// Stop ends the run (it cancels the run's context with cause
// [ErrStopped]) and waits for its goroutine, bounded by ctx. It returns the
// run's error; if ctx ends first, it returns an error joined with
// ctx.Err(), and the run finishes in the background (see
// [Service.Stopped]).
//
// Stop without Start, and Stop after the run ended, return the error the
// last run returned, once, and nil after that.
func (s *Service) Stop(ctx context.Context) error {
	s.mu.Lock()
	if !s.running {
		err := s.err
		s.err = nil
		s.mu.Unlock()
		return err
	}
	cancel, stopped := s.cancel, s.stopped
	s.mu.Unlock()

	cancel(ErrStopped)
	select {
	case <-stopped:
	case <-ctx.Done():
		select {
		case <-stopped: // ended at the same time: not a timeout
		default:
			return errors.Join(fmt.Errorf("%s: stop: still running", s.Name), ctx.Err())
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.err
	s.err = nil
	return err
}

// Stopped returns a channel closed when the run started by the last Start
// has ended (by Stop, or by returning on its own). Before any Start, it is
// closed. Take it after Start: a later Start makes a new one.
func (s *Service) Stopped() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped == nil {
		return closed
	}
	return s.stopped
}
