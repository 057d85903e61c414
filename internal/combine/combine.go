// Package combine shares round trips between goroutines: the operations
// that arrive while one round trip is under way go out together in the
// next (flat combining). It has its own home because several layers use
// it — claim mode's claims (package inbox), the consumer's acks and the
// completed-cache's reads and writes (package middleware) — and the
// hand-over below is the subtle part all must get right once.
//
// Nothing waits to fill a round: an operation that finds no round trip
// under way is sent at once, alone. The caller that sends a round sends
// one: if more operations queued meanwhile, the first of their callers is
// woken to send the next, so no caller works for the others for long.
package combine

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// ErrRoundPanicked is returned to the callers of a round whose send
// panicked on another caller's goroutine (the panic goes on there).
var ErrRoundPanicked = errors.New("combine: round panicked")

// Combiner runs operations of type T (a pointer to a request that the
// round fills with its answer) in shared rounds. It holds no goroutine and
// is safe for concurrent use; build it with [New].
type Combiner[T any] struct {
	send  func(batch []T)
	split func(queue []T) []bool

	mu    sync.Mutex
	queue []*entry[T]
	busy  bool // a round is being sent
}

type entry[T any] struct {
	v    T
	lead bool          // woken to send the next round
	err  error         // the round's own failure (a panic)
	done chan struct{} // one signal per wake-up: answered, or lead
}

// New returns a Combiner whose rounds call send with the operations of
// the round, in arrival order; send answers each (it must not keep the
// slice). split, if not nil, chooses which queued operations go in the
// next round (true) and which wait for a later one, in order; the first
// of the queue always goes, whatever split says.
func New[T any](send func(batch []T), split func(queue []T) []bool) *Combiner[T] {
	return &Combiner[T]{send: send, split: split}
}

// Do runs v in a round and returns once v is answered: in a round of its
// own if none is under way, else in the next one. If ctx ends while v is
// still queued (or had ended already), v is withdrawn, not sent, and ctx's
// error is returned; once v is in a round the wait goes on until the round
// is done. If the round's send panics, the panic goes on in the caller
// that sent it, and the round's other callers get [ErrRoundPanicked].
func (c *Combiner[T]) Do(ctx context.Context, v T) error {
	return c.DoBy(ctx, time.Time{}, v)
}

// DoBy is [Combiner.Do] with a deadline of its own besides ctx's (none if
// zero): v is withdrawn, and [context.DeadlineExceeded] returned, if the
// deadline passes while v is still queued, as if ctx had that deadline.
// It saves a caller the context (and its timer) it would build for the
// bound: the wait arms a timer only when v has to queue.
func (c *Combiner[T]) DoBy(ctx context.Context, deadline time.Time, v T) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !deadline.IsZero() && !time.Now().Before(deadline) {
		return context.DeadlineExceeded
	}
	e := &entry[T]{v: v, done: make(chan struct{}, 1)}
	c.mu.Lock()
	c.queue = append(c.queue, e)
	if c.busy {
		c.mu.Unlock()
		if err := c.wait(ctx, deadline, e); err != nil || !e.lead {
			return cmpErr(err, e.err)
		}
		c.mu.Lock() // handed the next round
	}
	c.busy = true
	batch := c.take()
	c.mu.Unlock()

	defer c.handOver() // also when send panics: the queue must go on
	c.run(batch, e)
	return e.err
}

// handOver wakes the first queued caller to send the next round, or marks
// the combiner idle.
func (c *Combiner[T]) handOver() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) > 0 {
		next := c.queue[0]
		next.lead = true
		next.done <- struct{}{}
	} else {
		c.busy = false
	}
}

// Queued reports the operations waiting for the next round.
func (c *Combiner[T]) Queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// take removes the next round's entries from the queue; c.mu is held.
func (c *Combiner[T]) take() []*entry[T] {
	if c.split == nil || len(c.queue) == 1 {
		batch := c.queue
		c.queue = nil
		return batch
	}
	vs := make([]T, len(c.queue))
	for i, e := range c.queue {
		vs[i] = e.v
	}
	now := c.split(vs)
	var batch, later []*entry[T]
	for i, e := range c.queue {
		if i == 0 || (i < len(now) && now[i]) {
			batch = append(batch, e)
		} else {
			later = append(later, e)
		}
	}
	c.queue = later
	return batch
}

// run sends batch, then wakes every caller in it but self (the sender).
//
// If send panics, the others are woken with [ErrRoundPanicked] and the
// panic goes on, unrecovered, on the sender's goroutine: there it reaches
// whatever guards the sender's own work (for a delivery, the consumer's
// last guard, which logs its stack), while the callers it was sending for
// are not left waiting. No recover is needed for that, only this defer.
func (c *Combiner[T]) run(batch []*entry[T], self *entry[T]) {
	sent := false
	defer func() {
		for _, e := range batch {
			if e == self {
				continue
			}
			if !sent {
				e.err = ErrRoundPanicked
			}
			e.lead = false
			e.done <- struct{}{}
		}
	}()
	vs := make([]T, len(batch))
	for i, e := range batch {
		vs[i] = e.v
	}
	c.send(vs)
	sent = true
}

// wait waits until e is answered or handed the next round. If ctx ends,
// or deadline (if not zero) passes, first and e is still queued, it is
// withdrawn.
func (c *Combiner[T]) wait(ctx context.Context, deadline time.Time, e *entry[T]) error {
	var expired <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		expired = t.C
	}
	var err error
	select {
	case <-e.done:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-expired:
		err = context.DeadlineExceeded
	}
	c.mu.Lock()
	if i := slices.Index(c.queue, e); i > 0 || (i == 0 && !e.lead) {
		c.queue = slices.Delete(c.queue, i, i+1)
		c.mu.Unlock()
		return err
	}
	c.mu.Unlock()
	<-e.done
	return nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
