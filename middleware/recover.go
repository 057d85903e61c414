package middleware

import (
	"context"
	"fmt"
	"runtime/debug"

	"go.uber.org/zap"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/clip"
	"github.com/inboxmq/inboxmq/retry"
)

// PanicError is the error [Recover] returns for a recovered panic. It
// classifies like any unknown error (retried under the handler's policy,
// then dead-lettered), with reason retry.ReasonPanic.
type PanicError struct {
	// Value is the value passed to panic.
	Value any
	// Stack is the panicking goroutine's stack trace.
	Stack []byte
}

// Error returns "middleware: panic: <value>" (the stack is in Stack, not in
// the message, so dead letters' x-error headers stay short).
func (e *PanicError) Error() string { return fmt.Sprintf("middleware: panic: %v", e.Value) }

// Unwrap returns the panic value if it is an error, else nil.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// RecoverOpts configure [Recover]. A nil *RecoverOpts means defaults.
type RecoverOpts struct {
	// Logger logs each recovered panic at error level with its stack in
	// field "stack" (the error itself carries only the value, to keep the
	// dead letter's x-error header short). The panic value's text is cut to
	// 1 KiB, and the logger adds no stack trace of its own (the recovering
	// frame's would repeat the panic's). Defaults to no logging.
	Logger *zap.Logger
}

// Recover returns a middleware that turns a panic in the rest of the chain
// into an error, so the worker lives on: a *[PanicError] with the stack,
// wrapped with reason retry.ReasonPanic. A message that panics every time
// is retried under the handler's policy and then dead-lettered, never
// hot-looped. Put it outermost.
func Recover(opts *RecoverOpts) inboxtype.Middleware {
	var logger *zap.Logger
	if opts != nil && opts.Logger != nil {
		logger = opts.Logger.WithOptions(zap.AddStacktrace(noStacktrace))
	}
	return func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
		return func(ctx context.Context, d *inboxtype.Delivery) (err error) {
			defer func() {
				v := recover()
				if v == nil {
					return
				}
				perr := &PanicError{Value: v, Stack: debug.Stack()}
				if logger != nil {
					logger.Error("handler panicked",
						zap.String(logFieldQueue, d.Queue),
						zap.String(logFieldConsumer, d.Namespace),
						zap.String(logFieldMessageID, d.MessageID),
						zap.String(logFieldIdempotencyKey, d.Key),
						zap.String("panic", clip.Text(fmt.Sprint(v), clip.Limit)),
						zap.ByteString("stack", perr.Stack))
				}
				err = retry.WithReason(retry.ReasonPanic, perr)
			}()
			return next(ctx, d)
		}
	}
}
