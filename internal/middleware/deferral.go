package middleware

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// ReasonKeyDeferred is the retry reason of a delivery held back because a
// run of its key (or tenant) asked for a delay.
const ReasonKeyDeferred = "key_deferred"

// Deferral defers a key after one of its runs asked for a delay
// (retry.After with a delay: a downstream's 429 with Retry-After, say):
// until that delay has passed, the key's next deliveries are deferred at
// once, without running (retry.Defer: no attempt counted, reason
// key_deferred), while every other key flows and the listener keeps
// consuming. With tenant set, the deferral is the tenant's: tenant(d)
// names it (a delivery it names "" is deferred by its key). The delivery
// that asked is retried as its error says.
//
// Deferrals live in this process: each worker learns them from its own
// runs. A key no longer deferred is forgotten.
func Deferral(tenant func(*inboxtype.Delivery) string) inboxtype.Middleware {
	s := &deferrals{until: make(map[string]time.Time)}
	return func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
		return func(ctx context.Context, d *inboxtype.Delivery) error {
			id := d.Key
			if tenant != nil {
				if t := tenant(d); t != "" {
					id = "tenant\x00" + t
				}
			}
			if id == "" {
				return next(ctx, d)
			}
			now := time.Now()
			if until, ok := s.get(id, now); ok {
				what := "key " + d.Key
				if id != d.Key {
					what = "tenant " + id[len("tenant\x00"):]
				}
				return retry.Defer(until.Sub(now), retry.WithReason(ReasonKeyDeferred,
					fmt.Errorf("middleware: %s deferred until %s by an earlier run's retry.After", what, until.Format(time.RFC3339Nano))))
			}
			err := next(ctx, d)
			// AsType, not As: a target variable would escape, one
			// allocation per delivery.
			if re, ok := errors.AsType[*retry.RetryableError](err); ok && re.Delay > 0 && !re.Uncounted {
				s.set(id, time.Now().Add(re.Delay))
			}
			return err
		}
	}
}

// deferrals maps a key (or tenant) to the end of its deferral.
type deferrals struct {
	n     atomic.Int64 // entries: a process with none takes no lock
	mu    sync.Mutex
	until map[string]time.Time
	sweep int // the map's size that triggers the next sweep of ended ones
}

func (s *deferrals) get(id string, now time.Time) (time.Time, bool) {
	if s.n.Load() == 0 {
		return time.Time{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	until, ok := s.until[id]
	if ok && !now.Before(until) {
		delete(s.until, id)
		s.n.Add(-1)
		return time.Time{}, false
	}
	return until, ok
}

func (s *deferrals) set(id string, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.until[id]; ok {
		if until.After(old) {
			s.until[id] = until
		}
		return
	}
	s.until[id] = until
	s.n.Add(1)
	if len(s.until) < max(s.sweep, 1024) {
		return
	}
	// Forget the ended deferrals of keys that never came back.
	now := time.Now()
	for k, u := range s.until {
		if !now.Before(u) {
			delete(s.until, k)
			s.n.Add(-1)
		}
	}
	s.sweep = 2 * len(s.until)
}
