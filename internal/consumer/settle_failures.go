package consumer

import (
	"hash/maphash"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A delivery whose settlement failed (its copy was not confirmed, its ack
// was lost, its channel died under it) comes back: requeued by us or
// redelivered by the broker, often at once and, when its session failed,
// on the next session. If the same failure follows every time (a copy the
// broker refuses by closing the connection, say), that is a hot loop of
// handler runs and reconnects. settleFailures remembers, per delivery and
// across sessions, how often its settlement failed lately, so that each
// return waits longer before it runs again.

const (
	// maxSettleFailures bounds the deliveries remembered at once; beyond it
	// the one whose last failure is oldest is forgotten.
	maxSettleFailures = 10_000
	// settleFailureMemory is how long a delivery is remembered after its
	// delay ended; one that stays away longer starts from scratch.
	settleFailureMemory = 10 * time.Minute
)

// settleDelay is the wait after the n-th settlement failure in a row
// (1-based): 100ms doubling up to 30s, jittered in [0.5, 1.5).
func settleDelay(n int) time.Duration {
	base := min(100*time.Millisecond<<min(max(n, 1)-1, 9), 30*time.Second)
	return time.Duration(float64(base) * (0.5 + rand.Float64()))
}

// deliveryID identifies a message across deliveries: its queue, broker
// message id and a hash of its body (a message id may be missing or
// reused). A collision only makes a message wait longer than it should.
type deliveryID struct {
	queue, messageID string
	body             uint64
}

var bodySeed = maphash.MakeSeed()

func identify(queue string, raw *amqp.Delivery) deliveryID {
	return deliveryID{queue: queue, messageID: raw.MessageId, body: maphash.Bytes(bodySeed, raw.Body)}
}

// settleFailure is what is remembered of one delivery.
type settleFailure struct {
	count int       // settlement failures in a row
	until time.Time // its next run waits until then
}

// settleFailures is the consumer's memory of recent settlement failures.
// It is safe for concurrent use, and costs a delivery nothing while it is
// empty.
type settleFailures struct {
	size atomic.Int32 // len(m), read without the lock
	mu   sync.Mutex
	m    map[deliveryID]*settleFailure
}

// record counts a settlement failure of id and returns how long its next
// run should wait. atLeast raises the count (the route's streak of failed
// copies: a broker refusing every copy slows every message down).
func (f *settleFailures) record(id deliveryID, atLeast int, now time.Time) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = make(map[deliveryID]*settleFailure)
	}
	e, ok := f.m[id]
	if ok && now.After(e.until.Add(settleFailureMemory)) {
		e.count = 0
	}
	if !ok {
		if len(f.m) >= maxSettleFailures {
			f.evict(now)
		}
		e = &settleFailure{}
		f.m[id] = e
		f.size.Store(int32(len(f.m))) //nolint:gosec // bounded by maxSettleFailures
	}
	e.count = max(e.count+1, atLeast)
	wait := settleDelay(e.count)
	e.until = now.Add(wait)
	return wait
}

// evict forgets what is past its memory, or else the oldest entry.
func (f *settleFailures) evict(now time.Time) {
	var oldest deliveryID
	var oldestUntil time.Time
	for id, e := range f.m {
		if now.After(e.until.Add(settleFailureMemory)) {
			delete(f.m, id)
			continue
		}
		if oldestUntil.IsZero() || e.until.Before(oldestUntil) {
			oldest, oldestUntil = id, e.until
		}
	}
	if len(f.m) >= maxSettleFailures {
		delete(f.m, oldest)
	}
}

// hold reports how long a delivery of raw must still wait before it runs
// (zero if its settlement did not fail lately) and its failures in a row.
func (f *settleFailures) hold(queue string, raw *amqp.Delivery, now time.Time) (time.Duration, int) {
	if f.size.Load() == 0 {
		return 0, 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.m[identify(queue, raw)]
	if !ok {
		return 0, 0
	}
	return max(e.until.Sub(now), 0), e.count
}

// forget drops raw's record once it was settled.
func (f *settleFailures) forget(queue string, raw *amqp.Delivery) {
	if f.size.Load() == 0 {
		return
	}
	id := identify(queue, raw)
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, id)
	f.size.Store(int32(len(f.m))) //nolint:gosec // bounded by maxSettleFailures
}
