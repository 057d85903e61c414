package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
)

// route is the runtime state of one registered route: its worker pool's
// job channel, the semaphore that limits running handlers, and the pause
// state. It outlives connections: a paused queue stays paused across
// reconnects, and the pool keeps its workers.
type route struct {
	Route
	jobs chan job
	sem  *semaphore
	// lanes serialise an ordered route's deliveries per ordering key.
	lanes *lanes

	// copyFailures counts retry/DLQ copies that failed in a row; it spaces
	// the requeues that follow (requeueAfter).
	copyFailures atomic.Int32

	mu sync.Mutex
	// operator is the pause of Pause/Resume; holds are the restrictions
	// of Restrict, by reason (0: paused, n > 0: at most n at once). The
	// queue is paused while either pauses it.
	operator bool
	holds    map[string]int
	paused   bool          // operator, or a hold of 0
	changed  chan struct{} // closed and replaced when paused changes
}

func newRoute(r Route) *route {
	n := r.Opts.Queue.Concurrency
	return &route{
		Route:   r,
		lanes:   newLanes(),
		jobs:    make(chan job),
		sem:     &semaphore{limit: n, wake: make(chan struct{})},
		changed: make(chan struct{}),
	}
}

func (r *route) isPaused() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.paused
}

// pauseState returns the pause flag and a channel closed at its next change.
func (r *route) pauseState() (bool, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.paused, r.changed
}

func (r *route) setPaused(p bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.operator = p
	r.updateLocked()
}

// updateLocked recomputes the pause flag and the semaphore's cap from the
// operator's pause and the holds; r.mu is held.
func (r *route) updateLocked() {
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

func (c *Consumer) route(queue string) (*route, error) {
	r, ok := c.byQueue[queue]
	if !ok {
		return nil, fmt.Errorf("consumer: no handler for queue %q", queue)
	}
	return r, nil
}

// Pause stops taking deliveries from queue: its broker consumer is
// cancelled (basic.cancel) and prefetched deliveries that no handler has
// started are requeued; in-flight ones finish and settle normally. The
// queue stays paused across reconnects until [Consumer.Resume]. Pausing a
// paused queue does nothing; Pause before Start makes Start skip the queue.
// It returns once the pause is recorded, not when the broker confirmed the
// cancel.
func (c *Consumer) Pause(queue string) error {
	r, err := c.route(queue)
	if err != nil {
		return err
	}
	r.setPaused(true)
	c.log.LogAttrs(context.Background(), slog.LevelInfo, "consumer: queue paused", slog.String("queue", queue))
	return nil
}

// Resume consumes queue again after [Consumer.Pause]. Resuming a queue that
// is not paused does nothing.
func (c *Consumer) Resume(queue string) error {
	r, err := c.route(queue)
	if err != nil {
		return err
	}
	r.setPaused(false)
	c.log.LogAttrs(context.Background(), slog.LevelInfo, "consumer: queue resumed", slog.String("queue", queue))
	return nil
}

// Restrict holds queue back for reason, a short name other than the
// operator's (such as "breaker"): n = 0 pauses it as [Consumer.Pause] does,
// n > 0 lets at most n of its handlers run at once. Each reason is kept
// apart from the others and from the operator's Pause and SetConcurrency:
// the queue consumes only while no one pauses it, at the smallest of the
// limits, and lifting one reason ([Consumer.Unrestrict]) never undoes
// another (a breaker closing never resumes a queue an operator paused).
// Restricting again for the same reason replaces the earlier n.
func (c *Consumer) Restrict(queue, reason string, n int) error {
	r, err := c.route(queue)
	if err != nil {
		return err
	}
	if reason == "" || n < 0 {
		return fmt.Errorf("consumer: restrict %q: want a reason and n >= 0 (got %q, %d)", queue, reason, n)
	}
	r.mu.Lock()
	if r.holds == nil {
		r.holds = make(map[string]int)
	}
	r.holds[reason] = n
	r.updateLocked()
	r.mu.Unlock()
	c.log.LogAttrs(context.Background(), slog.LevelInfo, "consumer: queue restricted",
		slog.String("queue", queue), slog.String("reason", reason), slog.Int("concurrency", n))
	return nil
}

// Unrestrict lifts reason's restriction of queue (see [Consumer.Restrict]);
// the others, and the operator's pause and concurrency, stay. Lifting a
// reason that holds nothing does nothing.
func (c *Consumer) Unrestrict(queue, reason string) error {
	r, err := c.route(queue)
	if err != nil {
		return err
	}
	r.mu.Lock()
	_, had := r.holds[reason]
	delete(r.holds, reason)
	r.updateLocked()
	r.mu.Unlock()
	if had {
		c.log.LogAttrs(context.Background(), slog.LevelInfo, "consumer: queue restriction lifted",
			slog.String("queue", queue), slog.String("reason", reason))
	}
	return nil
}

// Paused reports whether queue is paused (by the operator or a
// restriction); an unknown queue is not.
func (c *Consumer) Paused(queue string) bool {
	r, err := c.route(queue)
	return err == nil && r.isPaused()
}

// SetConcurrency limits how many of queue's handlers run at once to n, from
// 1 to the configured QueueOpts.Concurrency (the worker pool keeps its size;
// a resizable semaphore does the limiting). n ≤ 0 restores the configured
// value. Handlers already running finish; the new limit applies to the next
// deliveries. Prefetch is not changed.
func (c *Consumer) SetConcurrency(queue string, n int) error {
	r, err := c.route(queue)
	if err != nil {
		return err
	}
	limit := r.Opts.Queue.Concurrency
	if n > limit {
		return fmt.Errorf("consumer: concurrency %d for %q exceeds the configured %d", n, queue, limit)
	}
	if n <= 0 {
		n = limit
	}
	r.sem.setLimit(n)
	return nil
}

// Concurrency reports queue's current concurrency limit, restrictions
// included (0 for an unknown queue).
func (c *Consumer) Concurrency(queue string) int {
	r, err := c.route(queue)
	if err != nil {
		return 0
	}
	return r.sem.getLimit()
}

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
