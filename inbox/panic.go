package inbox

import (
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/inboxmq/inboxmq/internal/clip"
	"github.com/inboxmq/inboxmq/retry"
)

// recovered turns p, a panic recovered while running u (a handler, or the
// batch that u leads), into u's error with reason panic, and logs its
// stack, once. The consumer's last guard is the one recover of a
// delivery's own goroutine; the inbox recovers only where a panic would
// not reach it: a handler run by a batch's leader for another delivery.
func (s *Store) recovered(p any, u *unit, what string) error {
	s.cfg.Logger.LogAttrs(u.ctx, slog.LevelError, "inbox: "+what+" panicked",
		slog.String("namespace", u.namespace), slog.String("idempotency_key", u.key),
		slog.String("message_id", u.messageID),
		slog.String("panic", clip.Text(fmt.Sprint(p), clip.Limit)), slog.String("stack", string(debug.Stack())))
	return retry.WithReason(retry.ReasonPanic, fmt.Errorf("inbox: %s panicked: %v", what, p))
}
