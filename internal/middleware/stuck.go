package middleware

import (
	"context"
	"sync"
	"time"

	"github.com/inboxmq/inboxmq/inboxtype"
)

// StuckHandler describes a handler that went on running after its context
// ended (its deadline passed, or the worker's stop cancelled it): it
// ignores its cancellation and holds its slot until it returns.
type StuckHandler struct {
	Queue, Namespace, Key, MessageID string
	// Over is how long the handler had run past the end of its context
	// when it was reported.
	Over time.Duration
}

// Stuck returns a middleware that reports each handler still running
// after past the end of its context: report is called once with stuck
// true (on a timer's goroutine), and, if that happened, again with stuck
// false when the handler returns (on the delivery's goroutine, Over then
// the whole time past the end). report must be fast. Mount it after the
// payload is decoded (a route's middleware), so that Key is known.
func Stuck(after time.Duration, report func(h StuckHandler, stuck bool)) inboxtype.Middleware {
	return func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
		return func(ctx context.Context, d *inboxtype.Delivery) error {
			w := &stuckWatch{after: after, report: report,
				h: StuckHandler{Queue: d.Queue, Namespace: d.Namespace, Key: d.Key, MessageID: d.MessageID}}
			unwatch := context.AfterFunc(ctx, w.ended)
			defer func() {
				unwatch()
				w.returned()
			}()
			return next(ctx, d)
		}
	}
}

// stuckWatch is one delivery's watch (see Stuck).
type stuckWatch struct {
	after  time.Duration
	report func(StuckHandler, bool)

	mu       sync.Mutex
	h        StuckHandler
	done     bool      // the handler returned
	reported bool      // report(h, true) was called
	endedAt  time.Time // when the context ended
	t        *time.Timer
}

// ended runs when the handler's context ends: it arms the stuck timer.
func (w *stuckWatch) ended() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return
	}
	w.endedAt = time.Now()
	w.t = time.AfterFunc(w.after, w.stuck)
}

func (w *stuckWatch) stuck() {
	w.mu.Lock()
	defer w.mu.Unlock() // held while reporting: returned waits, so the two reports keep their order
	if w.done {
		return
	}
	w.reported = true
	h := w.h
	h.Over = w.after
	w.report(h, true)
}

func (w *stuckWatch) returned() {
	w.mu.Lock()
	w.done = true
	if w.t != nil {
		w.t.Stop()
	}
	reported, h := w.reported, w.h
	h.Over = time.Since(w.endedAt)
	w.mu.Unlock()
	if reported {
		w.report(h, false)
	}
}
