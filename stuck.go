package inboxmq

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/inboxmq/inboxmq/internal/middleware"
	"github.com/inboxmq/inboxmq/internal/observe"
)

// maxStuckAfter bounds how long past the end of its context a handler may
// go on before it is reported stuck.
const maxStuckAfter = 10 * time.Second

// stuckAfter is how long past the end of its context (its HandlerTimeout,
// or the stop's cancellation) a handler that has not returned is reported
// stuck: a quarter of HandlerTimeout, from 100ms to 10s.
func (s *settings) stuckAfter() time.Duration {
	if s.HandlerTimeout <= 0 {
		return maxStuckAfter
	}
	return min(max(s.HandlerTimeout/4, 100*time.Millisecond), maxStuckAfter)
}

// stuckHandlers counts, per queue, the handlers that outlived their
// context and have not returned: each holds one of the route's slots.
type stuckHandlers map[string]*atomic.Int64

// reportStuck is the Stuck middleware's report: the handlers_stuck gauge,
// the count the liveness check reads, and a log line with the key.
func (w *Worker) reportStuck(h middleware.StuckHandler, stuck bool) {
	w.metrics.HandlerStuck(h.Queue, h.Namespace, stuck)
	attrs := []slog.Attr{
		slog.String("queue", h.Queue), slog.String("namespace", h.Namespace),
		slog.String("idempotency_key", h.Key), slog.String("message_id", h.MessageID),
	}
	if stuck {
		w.stuck[h.Queue].Add(1)
		w.logger.LogAttrs(context.Background(), slog.LevelError,
			"handler still running after its context ended: it ignores cancellation and holds a slot until it returns",
			append(attrs, slog.Duration("past_end", h.Over))...)
		return
	}
	w.stuck[h.Queue].Add(-1)
	w.logger.LogAttrs(context.Background(), slog.LevelWarn, "stuck handler returned",
		append(attrs, slog.Duration("past_end", h.Over))...)
}

// stuckCheck is a liveness check: it fails while every slot of a route is
// held by a stuck handler, so that the route can make no progress until a
// restart.
func (w *Worker) stuckCheck() observe.Check {
	return observe.Check{Name: "handlers", Func: func(context.Context) error {
		for queue, n := range w.stuck {
			stuck := int(n.Load())
			if limit := w.router.Concurrency(queue); stuck > 0 && stuck >= limit {
				return fmt.Errorf("all %d slots of queue %s are held by handlers that outlived their context (stuck)", limit, queue)
			}
		}
		return nil
	}}
}
