package consumer

import (
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
)

// settler is the part of *amqp.Channel that settles deliveries.
type settler interface {
	Ack(tag uint64, multiple bool) error
	Nack(tag uint64, multiple, requeue bool) error
}

// acker settles the deliveries of one channel, coalescing acks: a run of
// deliveries acked together that starts at the oldest unsettled delivery
// of the channel goes out as one basic.ack with multiple=true (one frame,
// one write, one broker operation) instead of one frame each. Group commit
// makes such runs: a batch's deliveries are committed, and acked, at once.
//
// multiple=true acks every unsettled tag up to the one named, so the acker
// must know every tag the channel handed out: the delivery loop tracks each
// one before any worker sees it, and every settlement of a tracked tag
// (ack, nack, requeue) goes through the acker. A run is acked with
// multiple=true only if every tracked tag at or below its last one is in
// the run or already settled; anything else is acked on its own.
//
// It adds no timed wait: the first caller becomes the combiner; it yields
// the processor a few times while more requests keep arriving (the workers
// of a batch released together), then writes one round. Callers that
// arrive while it writes queue up; the first of them writes the next round
// for them all (flat combining, handed on). Each caller returns once its
// own frame has been written.
//
// The hand-over is the one of internal/combine, but the acker does not use
// that package, on purpose: (1) combine allocates an entry and a channel per
// operation, while an ack is on every delivery's path and takes its request
// from a pool, so a settlement allocates nothing; (2) combine sends a
// round at once and never waits to fill it, while the acker's round first
// gathers the workers a group commit released together, which is what
// makes a multiple ack possible; (3) a round is planned against the window
// of tracked tags under the same lock as the queue, since track runs on the
// delivery loop between rounds; (4) each caller is released as soon as its
// own frame is written, not when the round ends; and (5) a settlement is
// never withdrawn: combine drops a queued operation when its ctx ends,
// which for an ack would leave a committed delivery unsettled.
type acker struct {
	ch    settler
	stats *ackStats // shared by the consumer's ackers; nil counts nothing
	// beforeRound is a test hook run by the combiner before each round,
	// with a function that counts the requests queued.
	beforeRound func(queued func() int)

	mu     sync.Mutex
	window []ackEntry // tracked tags in increasing order; sent ones before head
	head   int
	// compactAt is the window length past which sent entries are dropped
	// from the middle (see trim).
	compactAt int
	queue     []*ackReq
	spare     []*ackReq
	busy      bool // a combiner is sending
	// Buffers of the combiner's round, reused (one combiner at a time).
	frames []frame
	acks   []*ackReq
}

// ackStats counts settlement frames written and deliveries settled.
type ackStats struct {
	frames, settled atomic.Uint64
}

type ackEntry struct {
	tag   uint64
	state uint8
}

const (
	entryOpen  uint8 = iota // not settled
	entryReady              // ack requested in the round being computed
	entrySent               // its frame is written (or being written)
)

type ackOp uint8

const (
	opAck ackOp = iota
	opRequeue
	opReject
)

type ackReq struct {
	tag  uint64
	op   ackOp
	err  error
	lead bool          // woken to write the next round
	done chan struct{} // buffered: one signal per wake-up (settled, or lead)
}

var ackReqs = sync.Pool{New: func() any { return &ackReq{done: make(chan struct{}, 1)} }}

// frame is one basic.ack or basic.nack and the requests it settles: req
// alone, or the run of a multiple ack.
type frame struct {
	tag      uint64
	op       ackOp
	multiple bool
	req      *ackReq
	run      []*ackReq
}

func newAcker(ch settler, stats *ackStats) *acker {
	return &acker{ch: ch, stats: stats, compactAt: maxSentInWindow}
}

// track records a tag handed out by the channel, before any worker can
// settle it. Tags arrive in increasing order.
func (a *acker) track(tag uint64) {
	a.mu.Lock()
	a.window = append(a.window, ackEntry{tag: tag})
	a.mu.Unlock()
}

// nack settles tag with basic.nack (requeue or reject); settle is the
// general form.
func (a *acker) nack(tag uint64, requeue bool) error {
	if requeue {
		return a.settle(tag, opRequeue)
	}
	return a.settle(tag, opReject)
}

func (a *acker) settle(tag uint64, op ackOp) error {
	r := ackReqs.Get().(*ackReq)
	r.tag, r.op, r.err, r.lead = tag, op, nil, false
	defer ackReqs.Put(r)
	a.mu.Lock()
	a.queue = append(a.queue, r)
	if a.busy {
		a.mu.Unlock()
		<-r.done
		if !r.lead {
			return r.err
		}
		a.mu.Lock() // handed the next round
	}
	a.busy = true
	a.gather()
	if a.beforeRound != nil {
		a.mu.Unlock()
		a.beforeRound(a.queued)
		a.mu.Lock()
	}
	reqs := a.queue
	a.queue, a.spare = a.spare[:0], reqs
	frames := a.plan(reqs)
	a.mu.Unlock()
	if a.stats != nil {
		a.stats.frames.Add(uint64(len(frames)))
		a.stats.settled.Add(uint64(len(reqs)))
	}
	a.send(frames)
	// One round each: whoever queued meanwhile writes the next one, so no
	// worker (nor the delivery loop) settles for the others for long.
	a.mu.Lock()
	if len(a.queue) > 0 {
		next := a.queue[0]
		next.lead = true
		next.done <- struct{}{}
	} else {
		a.busy = false
	}
	a.mu.Unlock()
	<-r.done
	return r.err
}

// gather lets goroutines that are ready to run queue their requests
// before a round is planned: the deliveries of a group commit are released
// together, and their workers reach the acker one after the other. It
// yields while that adds requests, a few times at most; alone, a yield
// returns at once. Called with a.mu held.
func (a *acker) gather() {
	for range maxGatherYields {
		n := len(a.queue)
		a.mu.Unlock()
		runtime.Gosched()
		a.mu.Lock()
		if len(a.queue) == n {
			return
		}
	}
}

// maxGatherYields bounds gather.
const maxGatherYields = 8

func (a *acker) queued() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.queue)
}

// plan turns one round's requests into frames and marks their tags sent.
// Nacks go first and alone: a multiple ack sent before a nack of a lower
// tag would ack that delivery. Then the acked run at the head of the
// window, if any, becomes one multiple ack; every other ack is single.
// Called with a.mu held.
func (a *acker) plan(reqs []*ackReq) []frame {
	slices.SortFunc(reqs, func(x, y *ackReq) int {
		switch {
		case x.tag < y.tag:
			return -1
		case x.tag > y.tag:
			return 1
		}
		return 0
	})
	frames, acks := a.frames[:0], a.acks[:0]
	defer func() { a.frames, a.acks = frames[:0], acks[:0] }()
	for _, r := range reqs {
		i, tracked := a.find(r.tag)
		if r.op != opAck {
			if tracked {
				a.window[i].state = entrySent
			}
			frames = append(frames, frame{tag: r.tag, op: r.op, req: r})
			continue
		}
		if tracked && a.window[i].state == entryOpen {
			a.window[i].state = entryReady
		}
		acks = append(acks, r)
	}
	a.trim()
	// The run at the head: ready entries, and sent ones between them (a
	// multiple ack skips what is settled already), up to the first open
	// one. Everything at or below its last ready tag is then settled or
	// in the run, so one multiple ack covers exactly the run.
	end, ready := a.head, 0
	var last uint64
	for i := a.head; i < len(a.window) && a.window[i].state != entryOpen; i++ {
		if a.window[i].state == entryReady {
			end, last = i+1, a.window[i].tag
			ready++
		}
	}
	if ready > 1 {
		run := make([]*ackReq, 0, ready)
		rest := acks[:0] // filtered in place
		for _, r := range acks {
			if i, ok := a.find(r.tag); ok && i < end && a.window[i].state == entryReady {
				run = append(run, r)
			} else {
				rest = append(rest, r)
			}
		}
		for i := a.head; i < end; i++ {
			a.window[i].state = entrySent
		}
		frames = append(frames, frame{tag: last, op: opAck, multiple: true, run: run})
		acks = rest
	}
	for _, r := range acks {
		if i, ok := a.find(r.tag); ok {
			a.window[i].state = entrySent
		}
		frames = append(frames, frame{tag: r.tag, op: opAck, req: r})
	}
	a.trim()
	return frames
}

// find locates tag among the unsent part of the window.
func (a *acker) find(tag uint64) (int, bool) {
	w := a.window[a.head:]
	i, ok := slices.BinarySearchFunc(w, tag, func(e ackEntry, t uint64) int {
		switch {
		case e.tag < t:
			return -1
		case e.tag > t:
			return 1
		}
		return 0
	})
	return a.head + i, ok
}

// trim drops sent entries from the head and compacts the window. A
// delivery that runs long holds the head while later ones are settled; once
// the window has grown by maxSentInWindow entries the sent ones are dropped
// from the middle too, so it stays about as long as the deliveries still
// unsettled (at most the prefetch).
func (a *acker) trim() {
	for a.head < len(a.window) && a.window[a.head].state == entrySent {
		a.head++
	}
	if a.head == len(a.window) {
		a.window, a.head = a.window[:0], 0
		return
	}
	if len(a.window)-a.head > a.compactAt {
		n := 0
		for _, e := range a.window[a.head:] {
			if e.state != entrySent {
				a.window[n] = e
				n++
			}
		}
		a.window, a.head = a.window[:n], 0
		// Next time only once it has grown again as much: with more
		// unsettled deliveries than the bound, compaction stays amortised.
		a.compactAt = max(maxSentInWindow, 2*n)
		return
	}
	if a.head > 64 && a.head > len(a.window)/2 {
		n := copy(a.window, a.window[a.head:])
		a.window, a.head = a.window[:n], 0
	}
}

// maxSentInWindow bounds the window's growth behind a long-running delivery.
const maxSentInWindow = 4096

// send writes frames in order and releases their callers.
func (a *acker) send(frames []frame) {
	for _, f := range frames {
		var err error
		switch f.op {
		case opAck:
			err = a.ch.Ack(f.tag, f.multiple)
		case opRequeue:
			err = a.ch.Nack(f.tag, false, true)
		case opReject:
			err = a.ch.Nack(f.tag, false, false)
		}
		if f.req != nil {
			f.req.err, f.req.lead = err, false
			f.req.done <- struct{}{}
		}
		for _, r := range f.run {
			r.err, r.lead = err, false
			r.done <- struct{}{}
		}
	}
}
