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
// flag. It outlives connections: a paused queue stays paused across
// reconnects, and the pool keeps its workers.
type route struct {
	Route
	jobs chan job
	sem  *semaphore

	// copyFailures counts retry/DLQ copies that failed in a row; it spaces
	// the requeues that follow (requeueAfter).
	copyFailures atomic.Int32

	mu      sync.Mutex
	paused  bool
	changed chan struct{} // closed and replaced when paused changes
}

func newRoute(r Route) *route {
	n := r.Opts.Queue.Concurrency
	return &route{
		Route:   r,
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

// Paused reports whether queue is paused; an unknown queue is not.
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

// Concurrency reports queue's current concurrency limit (0 for an unknown
// queue).
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
	active  int
	waiters int
	wake    chan struct{}
}

// acquire takes a slot, or returns false when quit closes first.
func (s *semaphore) acquire(quit <-chan struct{}) bool {
	for {
		s.mu.Lock()
		if s.active < s.limit {
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

func (s *semaphore) getLimit() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limit
}

func (s *semaphore) broadcastLocked() {
	if s.waiters == 0 {
		return
	}
	close(s.wake)
	s.wake = make(chan struct{})
}
