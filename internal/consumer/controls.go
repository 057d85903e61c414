package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
)

// route is the runtime state of one registered route: its worker pool's
// job channel and, through its registration, the semaphore that limits
// running handlers and the pause state. It outlives connections: a paused
// queue stays paused across reconnects, and the pool keeps its workers.
type route struct {
	Route
	*control
	jobs chan job
	// lanes serialise an ordered route's deliveries per ordering key.
	lanes *lanes

	// copyFailures counts retry/DLQ copies that failed in a row; it spaces
	// the requeues that follow (requeueAfter).
	copyFailures atomic.Int32
}

func newRoute(r Route) *route {
	return &route{
		Route:   r,
		control: r.ctl,
		lanes:   newLanes(),
		jobs:    make(chan job),
	}
}

// control is a registered queue's pause and concurrency. It belongs to the
// Router, so that what pauses a queue (the runtime controls, a breaker) can
// be wired to the router before any consumer exists.
type control struct {
	sem        *semaphore
	configured int // the route's QueueOpts.Concurrency

	mu sync.Mutex
	// operator is the pause of Pause/Resume; holds are the restrictions
	// of Restrict, by reason (0: paused, n > 0: at most n at once). The
	// queue is paused while either pauses it.
	operator bool
	holds    map[string]int
	paused   bool          // operator, or a hold of 0
	changed  chan struct{} // closed and replaced when paused changes
}

func newControl(concurrency int) *control {
	return &control{
		sem:        &semaphore{limit: concurrency, wake: make(chan struct{})},
		configured: concurrency,
		changed:    make(chan struct{}),
	}
}

func (r *control) isPaused() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.paused
}

// pauseState returns the pause flag and a channel closed at its next change.
func (r *control) pauseState() (bool, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.paused, r.changed
}

func (r *control) setPaused(p bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.operator = p
	r.updateLocked()
}

// updateLocked recomputes the pause flag and the semaphore's cap from the
// operator's pause and the holds; r.mu is held.
func (r *control) updateLocked() {
	p, limit := r.operator, 0
	for _, n := range r.holds {
		if n == 0 {
			p = true
		} else if limit == 0 || n < limit {
			limit = n
		}
	}
	r.sem.setCap(limit)
	if r.paused == p {
		return
	}
	r.paused = p
	close(r.changed)
	r.changed = make(chan struct{})
}

// restrict records reason's hold of n (see Router.Restrict).
func (r *control) restrict(reason string, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.holds == nil {
		r.holds = make(map[string]int)
	}
	r.holds[reason] = n
	r.updateLocked()
}

// unrestrict lifts reason's hold; it reports whether there was one.
func (r *control) unrestrict(reason string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, had := r.holds[reason]
	delete(r.holds, reason)
	r.updateLocked()
	return had
}

func (rt *Router) control(queue string) (*control, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	reg, ok := rt.routes[queue]
	if !ok {
		return nil, fmt.Errorf("consumer: no handler for queue %q", queue)
	}
	return reg.ctl, nil
}

// Pause stops taking deliveries from queue: its broker consumer is
// cancelled (basic.cancel) and prefetched deliveries that no handler has
// started are requeued; in-flight ones finish and settle normally. The
// queue stays paused across reconnects until [Router.Resume]. Pausing a
// paused queue does nothing; a pause before the consumer starts makes it
// skip the queue. It returns once the pause is recorded, not when the
// broker confirmed the cancel.
func (rt *Router) Pause(queue string) error {
	c, err := rt.control(queue)
	if err != nil {
		return err
	}
	c.setPaused(true)
	return nil
}

// Resume consumes queue again after [Router.Pause]. Resuming a queue that
// is not paused does nothing.
func (rt *Router) Resume(queue string) error {
	c, err := rt.control(queue)
	if err != nil {
		return err
	}
	c.setPaused(false)
	return nil
}

// Restrict holds queue back for reason, a short name other than the
// operator's (such as "breaker"): n = 0 pauses it as [Router.Pause] does,
// n > 0 lets at most n of its handlers run at once. Each reason is kept
// apart from the others and from the operator's Pause and SetConcurrency:
// the queue consumes only while no one pauses it, at the smallest of the
// limits, and lifting one reason ([Router.Unrestrict]) never undoes
// another (a breaker closing never resumes a queue an operator paused).
// Restricting again for the same reason replaces the earlier n.
func (rt *Router) Restrict(queue, reason string, n int) error {
	c, err := rt.control(queue)
	if err != nil {
		return err
	}
	if reason == "" || n < 0 {
		return fmt.Errorf("consumer: restrict %q: want a reason and n >= 0 (got %q, %d)", queue, reason, n)
	}
	c.restrict(reason, n)
	return nil
}

// Unrestrict lifts reason's restriction of queue (see [Router.Restrict]);
// the others, and the operator's pause and concurrency, stay. Lifting a
// reason that holds nothing does nothing.
func (rt *Router) Unrestrict(queue, reason string) error {
	c, err := rt.control(queue)
	if err != nil {
		return err
	}
	c.unrestrict(reason)
	return nil
}

// Paused reports whether queue is paused (by the operator or a
// restriction); an unknown queue is not.
func (rt *Router) Paused(queue string) bool {
	c, err := rt.control(queue)
	return err == nil && c.isPaused()
}

// SetConcurrency limits how many of queue's handlers run at once to n, from
// 1 to the configured QueueOpts.Concurrency (the worker pool keeps its size;
// a resizable semaphore does the limiting). n ≤ 0 restores the configured
// value. Handlers already running finish; the new limit applies to the next
// deliveries. Prefetch is not changed.
func (rt *Router) SetConcurrency(queue string, n int) error {
	c, err := rt.control(queue)
	if err != nil {
		return err
	}
	if n > c.configured {
		return fmt.Errorf("consumer: concurrency %d for %q exceeds the configured %d", n, queue, c.configured)
	}
	if n <= 0 {
		n = c.configured
	}
	c.sem.setLimit(n)
	return nil
}

// Concurrency reports queue's current concurrency limit, restrictions
// included (0 for an unknown queue).
func (rt *Router) Concurrency(queue string) int {
	c, err := rt.control(queue)
	if err != nil {
		return 0
	}
	return c.sem.getLimit()
}

// Pause is [Router.Pause] on the consumer's router, logged.
func (c *Consumer) Pause(queue string) error {
	if err := c.cfg.Router.Pause(queue); err != nil {
		return err
	}
	c.log.LogAttrs(context.Background(), slog.LevelInfo, "consumer: queue paused", slog.String("queue", queue))
	return nil
}

// Resume is [Router.Resume] on the consumer's router, logged.
func (c *Consumer) Resume(queue string) error {
	if err := c.cfg.Router.Resume(queue); err != nil {
		return err
	}
	c.log.LogAttrs(context.Background(), slog.LevelInfo, "consumer: queue resumed", slog.String("queue", queue))
	return nil
}

// Restrict is [Router.Restrict] on the consumer's router, logged.
func (c *Consumer) Restrict(queue, reason string, n int) error {
	if err := c.cfg.Router.Restrict(queue, reason, n); err != nil {
		return err
	}
	c.log.LogAttrs(context.Background(), slog.LevelInfo, "consumer: queue restricted",
		slog.String("queue", queue), slog.String("reason", reason), slog.Int("concurrency", n))
	return nil
}

// Unrestrict is [Router.Unrestrict] on the consumer's router.
func (c *Consumer) Unrestrict(queue, reason string) error {
	return c.cfg.Router.Unrestrict(queue, reason)
}

// Paused is [Router.Paused] on the consumer's router.
func (c *Consumer) Paused(queue string) bool { return c.cfg.Router.Paused(queue) }

// SetConcurrency is [Router.SetConcurrency] on the consumer's router.
func (c *Consumer) SetConcurrency(queue string, n int) error {
	return c.cfg.Router.SetConcurrency(queue, n)
}

// Concurrency is [Router.Concurrency] on the consumer's router.
func (c *Consumer) Concurrency(queue string) int { return c.cfg.Router.Concurrency(queue) }

// semaphore is a counting semaphore whose limit can change while it is in
// use. Acquirers wait on a broadcast channel that is replaced only when
// someone waits, so the uncontended path allocates nothing.
type semaphore struct {
	mu      sync.Mutex
	limit   int
	cap     int // a restriction's limit, 0 for none; the lower one applies
	active  int
	waiters int
	wake    chan struct{}
}

// acquire takes a slot, or returns false when quit closes first.
func (s *semaphore) acquire(quit <-chan struct{}) bool {
	for {
		s.mu.Lock()
		if s.active < s.effectiveLocked() {
			s.active++
			s.mu.Unlock()
			return true
		}
		s.waiters++
		w := s.wake
		s.mu.Unlock()
		select {
		case <-w:
			s.mu.Lock()
			s.waiters--
			s.mu.Unlock()
		case <-quit:
			s.mu.Lock()
			s.waiters--
			s.mu.Unlock()
			return false
		}
	}
}

func (s *semaphore) release() {
	s.mu.Lock()
	s.active--
	s.broadcastLocked()
	s.mu.Unlock()
}

func (s *semaphore) setLimit(n int) {
	s.mu.Lock()
	s.limit = n
	s.broadcastLocked()
	s.mu.Unlock()
}

func (s *semaphore) setCap(n int) {
	s.mu.Lock()
	s.cap = n
	s.broadcastLocked()
	s.mu.Unlock()
}

func (s *semaphore) effectiveLocked() int {
	if s.cap > 0 && s.cap < s.limit {
		return s.cap
	}
	return s.limit
}

func (s *semaphore) getLimit() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.effectiveLocked()
}

func (s *semaphore) broadcastLocked() {
	if s.waiters == 0 {
		return
	}
	close(s.wake)
	s.wake = make(chan struct{})
}
