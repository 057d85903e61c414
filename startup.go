package inboxmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/inboxmq/inboxmq/internal/consumer"
)

// StartTimeoutError is returned by Worker.Start when a service did not
// answer within Config.ConnectTimeout: a server that accepts connections
// and never answers ends start-up with this error instead of a hang.
type StartTimeoutError struct {
	// Service is "PostgreSQL" or "RabbitMQ".
	Service string
	// Addr is the service's URL, its password redacted.
	Addr string
	// Timeout is the Config.ConnectTimeout that ran out.
	Timeout time.Duration
	// Err is the error of the last attempt.
	Err error
}

// Error says which service did not answer, where and within what.
func (e *StartTimeoutError) Error() string {
	return fmt.Sprintf("inboxmq: %s at %s did not answer within %s: %v", e.Service, e.Addr, e.Timeout, e.Err)
}

// Unwrap returns Err.
func (e *StartTimeoutError) Unwrap() error { return e.Err }

// startup bounds and reports the worker's waits for its services while it
// starts: each wait is logged, bounded by the connect timeout and named by
// the "startup" readiness check until the worker consumes.
type startup struct {
	logger  *slog.Logger
	timeout time.Duration
	state   atomic.Pointer[string] // what the worker is doing; nil while it consumes
}

func newStartup(logger *slog.Logger, timeout time.Duration) *startup {
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
// naming the service; past the timeout, a *StartTimeoutError.
func (s *startup) wait(ctx context.Context, service, rawURL, purpose string, connect func(context.Context) error) error {
	addr := consumer.RedactURL(rawURL)
	what := service + " at " + addr
	s.set("waiting for " + what)
	defer s.set("starting")
	s.logger.LogAttrs(ctx, slog.LevelInfo, "waiting for "+what, slog.String("for", purpose), slog.Duration("timeout", s.timeout))
	start := time.Now()
	deadline := start.Add(s.timeout)
	cctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	err := connect(cctx)
	switch {
	case err == nil:
		s.logger.LogAttrs(ctx, slog.LevelInfo, service+" answered", slog.String("for", purpose), slog.Duration("after", time.Since(start)))
		return nil
	case ctx.Err() == nil && !time.Now().Before(deadline):
		// Past the deadline, whether ctx or a socket deadline set from it
		// ended the wait.
		return &StartTimeoutError{Service: service, Addr: addr, Timeout: s.timeout, Err: err}
	default:
		return fmt.Errorf("inboxmq: %s (%s): %w", what, purpose, err)
	}
}
