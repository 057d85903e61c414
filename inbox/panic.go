package inbox

import (
	"fmt"
	"runtime/debug"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/inboxmq/inboxmq/internal/clip"
	"github.com/inboxmq/inboxmq/retry"
)

// recovered turns p, a panic recovered while running u (a handler, or the
// batch that u leads), into u's error with reason panic, and logs its
// stack, once. The consumer's last guard is the one recover of a
// delivery's own goroutine; the inbox recovers only where a panic would
// not reach it: a handler run by a batch's leader for another delivery,
// or on a goroutine of the pipeline.
func (s *Store) recovered(p any, u *unit, what string) error {
	s.cfg.Logger.WithOptions(zap.AddStacktrace(zapcore.FatalLevel+1)).Error("inbox: "+what+" panicked",
		zap.String("consumer", u.consumer), zap.String("idempotency_key", u.key),
		zap.String("message_id", u.messageID),
		zap.String("panic", clip.Text(fmt.Sprint(p), clip.Limit)), zap.ByteString("stack", debug.Stack()))
	return retry.WithReason(retry.ReasonPanic, fmt.Errorf("inbox: %s panicked: %v", what, p))
}
