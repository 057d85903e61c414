package middleware

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// ErrTimeout is the cause with which [Timeout] cancels a delivery's context
// when its deadline passes. Test it with
// errors.Is(context.Cause(ctx), ErrTimeout).
var ErrTimeout = errors.New("middleware: delivery timed out")

// Timeout returns a middleware that gives each delivery a deadline of d:
// the rest of the chain runs with a context cancelled with cause
// [ErrTimeout] after d (ctx.Err() is then context.DeadlineExceeded). An
// error returned after the deadline is wrapped with reason
// retry.ReasonTimeout and classifies as retryable unless it says
// otherwise (a permanent error stays permanent). A d of zero or less
// disables the deadline.
func Timeout(d time.Duration) inboxtype.Middleware {
	return func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
		if d <= 0 {
			return next
		}
		return func(ctx context.Context, del *inboxtype.Delivery) error {
			tctx, cancel := context.WithTimeoutCause(ctx, d, ErrTimeout)
			defer cancel()
			err := next(tctx, del)
			if err == nil || errors.Is(err, retry.ErrDuplicate) || !errors.Is(context.Cause(tctx), ErrTimeout) {
				return err
			}
			return retry.WithReason(retry.ReasonTimeout, fmt.Errorf("%w (after %s): %w", ErrTimeout, d, err))
		}
	}
}
