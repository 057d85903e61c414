package consumer

import "sync"

// fairShare shares a fair route's slots on one session among its tenants.
//
// The shard loops hand it every delivery (push); the session's fairLoop
// gives the route's workers, each time one is free, the oldest waiting
// delivery of the tenant with the fewest running deliveries for its
// weight: the smallest (running+1)/weight, the earliest waiting delivery
// on a tie. So the slots are shared in proportion to the weights among
// the tenants that have deliveries waiting, and a tenant alone takes them
// all (work-conserving). A tenant whose deliveries keep the broker's
// prefetch of its shard full cannot keep another tenant's deliveries out
// of the worker, since each shard has its own channel and prefetch; two
// tenants that hash to the same shard share its queue's order.
type fairShare struct {
	weights map[string]int

	mu      sync.Mutex
	waiting map[string][]fairJob // per tenant, in arrival order
	running map[string]int
	seq     uint64
	kick    chan struct{} // cap 1: a delivery arrived or a slot was freed
}

type fairJob struct {
	job
	seq uint64 // arrival order
}

func newFairShare(weights map[string]int) *fairShare {
	return &fairShare{
		weights: weights,
		waiting: make(map[string][]fairJob),
		running: make(map[string]int),
		kick:    make(chan struct{}, 1),
	}
}

func (f *fairShare) weight(tenant string) int {
	if w, ok := f.weights[tenant]; ok {
		return w
	}
	return 1
}

func (f *fairShare) wake() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// push queues a delivery of tenant j.key.
func (f *fairShare) push(j job) {
	f.mu.Lock()
	f.seq++
	f.waiting[j.key] = append(f.waiting[j.key], fairJob{job: j, seq: f.seq})
	f.mu.Unlock()
	f.wake()
}

// done frees a slot of tenant.
func (f *fairShare) done(tenant string) {
	f.unstart(tenant)
	f.wake()
}

// next returns the delivery that the next free slot goes to, without
// taking it off its queue.
func (f *fairShare) next() (job, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var (
		best         fairJob
		found        bool
		bestR, bestW int
	)
	for tenant, q := range f.waiting {
		r, w := f.running[tenant]+1, f.weight(tenant)
		// r/w < bestR/bestW, without division.
		if !found || r*bestW < bestR*w || (r*bestW == bestR*w && q[0].seq < best.seq) {
			best, bestR, bestW, found = q[0], r, w, true
		}
	}
	return best.job, found
}

// start counts a slot of tenant as taken, before its delivery is
// offered to the workers: a worker may finish it (done) before the offer
// returns. unstart gives the slot back when the offer was withdrawn.
func (f *fairShare) start(tenant string) {
	f.mu.Lock()
	f.running[tenant]++
	f.mu.Unlock()
}

func (f *fairShare) unstart(tenant string) {
	f.mu.Lock()
	if f.running[tenant]--; f.running[tenant] <= 0 {
		delete(f.running, tenant)
	}
	f.mu.Unlock()
}

// pop takes the first waiting delivery of tenant off its queue: the one
// next returned, since only fairLoop takes deliveries.
func (f *fairShare) pop(tenant string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	q := f.waiting[tenant]
	q[0] = fairJob{}
	if len(q) == 1 {
		delete(f.waiting, tenant)
	} else {
		f.waiting[tenant] = q[1:]
	}
}

// drain takes every waiting delivery off its queue.
func (f *fairShare) drain() []job {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []job
	for tenant, q := range f.waiting {
		for _, fj := range q {
			out = append(out, fj.job)
		}
		delete(f.waiting, tenant)
	}
	return out
}

// fairLoop gives a fair route's waiting deliveries to its workers (see
// fairShare) until Stop, a pause or the session's end; then it returns the
// deliveries still waiting to their queues (requeued; on a session that is
// gone, the broker has them back already), which lets the shard loops'
// wait for their deliveries in flight end.
func (s *session) fairLoop(r *route, f *fairShare) {
	defer s.loops.Done()
	release := func(requeue bool) {
		for _, j := range f.drain() {
			if requeue {
				_ = j.requeue()
			}
			j.shard.inflight.Done()
		}
	}
	for {
		paused, changed := r.pauseState()
		if paused {
			release(true)
			select {
			case <-changed:
				continue
			case <-s.stopConsuming:
				release(true)
				return
			case <-s.failed:
				release(false)
				return
			}
		}
		j, ok := f.next()
		var jobs chan<- job
		if ok {
			jobs = r.jobs // nil while nothing waits: the send blocks
			f.start(j.key)
		}
		select {
		case jobs <- j:
			f.pop(j.key)
			continue
		case <-f.kick: // a new delivery or a freed slot: choose again
		case <-changed:
		case <-s.stopConsuming:
			release(true)
			return
		case <-s.failed:
			release(false)
			return
		}
		if ok {
			f.unstart(j.key)
		}
	}
}
