package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/inboxmq/inboxmq/consumer"
)

// startup bounds and reports the worker's waits for its services while it
// starts: each wait is logged, bounded by CONNECT_TIMEOUT, and named in
// /readyz (check "startup") until the worker consumes. A service that
// accepts connections and never answers thus ends start-up with an error
// naming it, instead of hanging with no sign of what is wrong.
type startup struct {
	logger  *zap.Logger
	timeout time.Duration
	state   atomic.Pointer[string] // what start-up is doing; nil once done
}

func newStartup(logger *zap.Logger, timeout time.Duration) *startup {
	s := &startup{logger: logger, timeout: timeout}
	s.set("starting")
	return s
}

func (s *startup) set(state string) { s.state.Store(&state) }

// done marks start-up complete: the "startup" check passes from now on.
func (s *startup) done() { s.state.Store(nil) }

// check is the "startup" readiness check.
func (s *startup) check(context.Context) error {
	if p := s.state.Load(); p != nil {
		return errors.New(*p)
	}
	return nil
}

// wait logs "waiting for <service> at <url>" (the URL redacted), runs
// connect with a context bounded by the timeout and returns its error
// naming the service; past the timeout, the error says so.
func (s *startup) wait(ctx context.Context, service, rawURL, purpose string, connect func(context.Context) error) error {
	what := service + " at " + consumer.RedactURL(rawURL)
	s.set("waiting for " + what)
	defer s.set("starting")
	s.logger.Info("waiting for "+what, zap.String("for", purpose), zap.Duration("timeout", s.timeout))
	start := time.Now()
	deadline := start.Add(s.timeout)
	cctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	err := connect(cctx)
	switch {
	case err == nil:
		s.logger.Info(service+" answered", zap.String("for", purpose), zap.Duration("after", time.Since(start)))
		return nil
	case ctx.Err() == nil && !time.Now().Before(deadline):
		// Past the deadline, whether ctx or a socket deadline set from it
		// ended the wait.
		return fmt.Errorf("%s did not answer within %s (CONNECT_TIMEOUT): %w", what, s.timeout, err)
	default:
		return fmt.Errorf("%s: %w", what, err)
	}
}
