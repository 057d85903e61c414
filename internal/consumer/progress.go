package consumer

import (
	"sync/atomic"
	"time"
)

// progress is the consumer's own account of whether it moves: how many
// deliveries its workers hold (from the start of their handling to the end
// of their settlement) and when it last made progress. A liveness
// watchdog reads it ([Consumer.Progress]).
type progress struct {
	inFlight atomic.Int64
	// last is the unix-nano time of the last settlement, or of the start
	// of work after an idle spell (a delivery taken while none was held).
	last atomic.Int64
}

// begin records a delivery taken up by a worker.
func (p *progress) begin() {
	if p.inFlight.Add(1) == 1 {
		p.last.Store(time.Now().UnixNano())
	}
}

// end records a delivery settled (or given back) by a worker.
func (p *progress) end() {
	p.last.Store(time.Now().UnixNano())
	p.inFlight.Add(-1)
}

// Progress is a snapshot of the consumer's progress: what a liveness
// watchdog needs to tell a stuck consumer from an idle one.
type Progress struct {
	// InFlight is how many deliveries the workers hold: being handled, or
	// being settled (acked, or published to a retry or dead-letter queue
	// and then acked). Prefetched deliveries waiting for a worker do not
	// count.
	InFlight int
	// LastProgress is when a delivery was last settled, or when the
	// workers took up a delivery after holding none, whichever is later.
	// Zero before the first delivery.
	LastProgress time.Time
}

// Progress returns the consumer's progress: deliveries in flight and the
// time of its last progress. It is cheap and safe to call at any time.
func (c *Consumer) Progress() Progress {
	out := Progress{InFlight: int(c.progress.inFlight.Load())}
	if ns := c.progress.last.Load(); ns != 0 {
		out.LastProgress = time.Unix(0, ns)
	}
	return out
}
