package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// seqEvent is one event of an aggregate: the Seq-th of Key.
type seqEvent struct {
	Key string `json:"key"`
	Seq int    `json:"seq"`
}

func (e seqEvent) IdempotencyKey() string { return e.Key + ":" + strconv.Itoa(e.Seq) }

// effect is one applied event, in the order effects were applied.
type effect struct {
	key         string
	seq         int
	worker      string
	redelivered bool
	at          time.Time
}

// effects is an in-memory inbox plus business table: an event applies
// once (a second copy is a duplicate), and the log keeps the apply order.
type effects struct {
	mu   sync.Mutex
	done map[string]bool
	log  []effect
	// fail, when set, decides the error of an event's run (nil applies it).
	fail func(e seqEvent, attempt int) error
}

func newEffects() *effects { return &effects{done: make(map[string]bool)} }

func (f *effects) handle(ctx context.Context, m *inboxtype.Message[seqEvent]) error {
	// Some work, of a length that varies from event to event, so that an
	// event that is not held back behind its predecessor overtakes it.
	select {
	case <-time.After(time.Duration(m.Body.Seq*7%4) * time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done[m.Key] {
		return retry.ErrDuplicate
	}
	if f.fail != nil {
		if err := f.fail(m.Body, m.Attempt); err != nil {
			return err
		}
	}
	f.done[m.Key] = true
	f.log = append(f.log, effect{key: m.Body.Key, seq: m.Body.Seq, worker: m.Delivery.WorkerID, redelivered: m.Redelivered, at: time.Now()})
	return nil
}

func (f *effects) count(worker string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, e := range f.log {
		if worker == "" || e.worker == worker {
			n++
		}
	}
	return n
}

// requireInOrder checks that every key's events applied exactly once, in
// publish order: per key the sequence is 1..last[key].
func (f *effects) requireInOrder(t *testing.T, last map[string]int) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	seqs := make(map[string][]int)
	for _, e := range f.log {
		seqs[e.key] = append(seqs[e.key], e.seq)
	}
	for key, n := range last {
		want := make([]int, n)
		for i := range want {
			want[i] = i + 1
		}
		if !slices.Equal(want, seqs[key]) {
			for _, e := range f.log {
				if e.key == key {
					t.Logf("%s %d %s redelivered=%v %s", e.key, e.seq, e.worker, e.redelivered, e.at.Format("15:04:05.000000"))
				}
			}
		}
		require.Equal(t, want, seqs[key], "key %s: effects out of order, missing or repeated", key)
	}
}

type orderedBundle struct {
	*testBundle
	shards int
	fx     *effects
	router *consumer.Router
	burst  *amqp.Channel
}

func setupOrdered(t *testing.T, shards int, opts *consumer.HandlerOpts) *orderedBundle {
	t.Helper()
	b := setup(t)
	amqptest.DeleteOrderedAtCleanup(t, b.conn, b.queue, shards)
	fx := newEffects()
	router := consumer.NewRouter()
	if opts == nil {
		opts = &consumer.HandlerOpts{}
	}
	opts.Ordered = &consumer.OrderedOpts{Shards: shards, RebalanceInterval: 100 * time.Millisecond, MaxRetryDelay: 50 * time.Millisecond}
	if opts.Queue.Concurrency == 0 {
		opts.Queue.Concurrency = 4
	}
	consumer.Register(router, b.queue, inboxtype.HandlerFunc[seqEvent](fx.handle), opts)
	return &orderedBundle{testBundle: b, shards: shards, fx: fx, router: router}
}

func (b *orderedBundle) worker(t *testing.T, name string) *consumer.Consumer {
	t.Helper()
	return b.start(t, b.router, func(c *consumer.Config) {
		c.Name = name
		c.Observers = nil // the stream is longer than the recorder's buffer
	})
}

func (b *orderedBundle) publishEvent(t *testing.T, e seqEvent) {
	t.Helper()
	body, err := json.Marshal(e)
	require.NoError(t, err)
	b.pub.PublishTo(b.queue, e.Key, body, amqp.Publishing{MessageId: e.IdempotencyKey()})
}

// publishBurst publishes events to the route's exchange in one go and
// then waits for every confirm, so that they reach the shards together.
func (b *orderedBundle) publishBurst(t *testing.T, events []seqEvent) {
	t.Helper()
	if b.burst == nil {
		ch, err := b.conn.Channel()
		require.NoError(t, err)
		require.NoError(t, ch.Confirm(false))
		t.Cleanup(func() { _ = ch.Close() })
		b.burst = ch
	}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
	defer cancel()
	var confirms []*amqp.DeferredConfirmation
	for _, e := range events {
		body, err := json.Marshal(e)
		require.NoError(t, err)
		dc, err := b.burst.PublishWithDeferredConfirmWithContext(ctx, b.queue, e.Key, true, false, amqp.Publishing{
			MessageId: e.IdempotencyKey(), DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: body,
		})
		require.NoError(t, err)
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		ok, err := dc.WaitContext(ctx)
		require.NoError(t, err)
		require.True(t, ok, "publish confirmed")
	}
}

// TestOrderedAcrossWorkers runs a stream of 24 keys through 3 workers
// that join and leave while it flows, with copies of some events (right
// after the original and far behind it): every key's events apply once
// each, in publish order, and each worker that joined took shards over.
func TestOrderedAcrossWorkers(t *testing.T) {
	t.Parallel()
	amqptest.RequireConsistentHash(t)
	for _, typ := range []consumer.QueueType{consumer.Classic, consumer.Quorum} {
		t.Run(string(typ), func(t *testing.T) {
			t.Parallel()
			testOrderedAcrossWorkers(t, typ)
		})
	}
}

func testOrderedAcrossWorkers(t *testing.T, typ consumer.QueueType) {
	b := setupOrdered(t, 6, &consumer.HandlerOpts{Queue: consumer.QueueOpts{Type: typ}})
	const keys = 24
	last := make(map[string]int)
	var sent []seqEvent
	n, copies := 0, 0
	publish := func(count int) {
		var burst []seqEvent
		for range count {
			key := "acct-" + strconv.Itoa(n%keys)
			last[key]++
			e := seqEvent{Key: key, Seq: last[key]}
			burst = append(burst, e)
			sent = append(sent, e)
			switch {
			case n%11 == 0: // a copy right behind the original
				burst = append(burst, e)
				copies++
			case n%13 == 0 && len(sent) > 60: // a copy far behind
				burst = append(burst, sent[len(sent)-60])
				copies++
			}
			n++
		}
		b.publishBurst(t, burst)
	}
	// keepPublishing publishes until cond holds.
	keepPublishing := func(what string, cond func() bool) {
		deadline := time.Now().Add(testenv.Timeout())
		for !cond() {
			require.False(t, time.Now().After(deadline), "timed out waiting for: %s", what)
			publish(96)
		}
	}

	a := b.worker(t, "worker-a")
	keepPublishing("worker-a applies events", func() bool { return b.fx.count("worker-a") >= 40 })
	b.worker(t, "worker-b")
	keepPublishing("worker-b takes shards over", func() bool { return b.fx.count("worker-b") >= 30 })
	b.worker(t, "worker-c")
	keepPublishing("worker-c takes shards over", func() bool { return b.fx.count("worker-c") >= 30 })
	b.stop(t, a) // worker-a leaves mid-stream
	before := b.fx.count("worker-b") + b.fx.count("worker-c")
	keepPublishing("the others take worker-a's shards", func() bool {
		return b.fx.count("worker-b")+b.fx.count("worker-c") >= before+60
	})
	publish(40)

	total := 0
	for _, v := range last {
		total += v
	}
	testenv.WaitFor(t, "every event applied", func() bool { return b.fx.count("") >= total })
	b.fx.requireInOrder(t, last)
	require.Equal(t, total, b.fx.count(""), "an event applied twice")
	t.Logf("%d events (%d more copies); applied by a=%d b=%d c=%d", total, copies, b.fx.count("worker-a"), b.fx.count("worker-b"), b.fx.count("worker-c"))
}

// TestOrderedRetryHoldsKey: a key's failing event is retried in process
// and its later events wait; once it is dead-lettered after the last
// attempt, they run.
func TestOrderedRetryHoldsKey(t *testing.T) {
	t.Parallel()
	amqptest.RequireConsistentHash(t)
	b := setupOrdered(t, 2, &consumer.HandlerOpts{
		Policy: retry.Exponential{InitialInterval: 10 * time.Millisecond, RandomizationFactor: -1, MaxAttempts: 4},
	})
	attempts := make(map[string]int)
	lastTry := -1 // effects applied when dead:1 failed its last attempt
	b.fx.fail = func(e seqEvent, attempt int) error {
		attempts[e.IdempotencyKey()] = attempt
		if e.Key == "dead" && e.Seq == 1 && attempt == 4 {
			lastTry = len(b.fx.log)
		}
		switch {
		case e.Key == "held" && e.Seq == 1 && attempt < 3:
			return errors.New("blip") // succeeds on the 3rd attempt
		case e.Key == "dead" && e.Seq == 1:
			return errors.New("down for good") // dead-lettered after 4
		}
		return nil
	}
	b.worker(t, "worker-a")
	for seq := 1; seq <= 3; seq++ {
		b.publishEvent(t, seqEvent{Key: "held", Seq: seq})
		b.publishEvent(t, seqEvent{Key: "dead", Seq: seq})
	}
	testenv.WaitFor(t, "held and dead keys done", func() bool { return b.fx.count("") >= 5 })
	b.fx.requireInOrder(t, map[string]int{"held": 3})

	b.fx.mu.Lock()
	applied := len(b.fx.log) // effects before the replay
	var dead []int
	for i, e := range b.fx.log {
		if e.key == "dead" {
			dead = append(dead, e.seq)
			require.GreaterOrEqual(t, i, lastTry, "dead:%d waited for dead:1's last attempt", e.seq)
		}
	}
	require.GreaterOrEqual(t, lastTry, 0, "dead:1 reached its last attempt")
	require.Equal(t, []int{2, 3}, dead, "the dead-lettered event released the key's later ones, in order")
	require.Equal(t, 3, attempts["held:1"])
	require.Equal(t, 4, attempts["dead:1"])
	b.fx.mu.Unlock()

	// The way out: fix the cause, replay from the DLQ. The replay goes
	// through the route's exchange to the key's shard and applies after
	// the key's later events (the documented gap).
	b.fx.mu.Lock()
	before := b.fx.fail
	b.fx.fail = func(e seqEvent, attempt int) error {
		if e.Key == "dead" {
			return nil
		}
		return before(e, attempt)
	}
	b.fx.mu.Unlock()
	res, err := consumer.ReplayDLQ(t.Context(), b.conn, b.queue, &consumer.ReplayOpts{Reason: retry.ReasonExhausted})
	require.NoError(t, err)
	require.Equal(t, 1, res.Replayed, "dead:1 was dead-lettered as exhausted")
	testenv.WaitFor(t, "the replayed dead:1 applied", func() bool { return b.fx.count("") >= 6 })
	b.fx.mu.Lock()
	defer b.fx.mu.Unlock()
	require.Equal(t, effect{key: "dead", seq: 1}, effect{key: b.fx.log[applied].key, seq: b.fx.log[applied].seq})
}

func TestOrderedOptsValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		o    consumer.OrderedOpts
		ok   bool
	}{
		{"defaults", consumer.OrderedOpts{}, true},
		{"too many shards", consumer.OrderedOpts{Shards: 5000}, false},
		{"negative shards", consumer.OrderedOpts{Shards: -1}, false},
		{"bad exchange", consumer.OrderedOpts{Exchange: "-x"}, false},
		{"rebalance disabled", consumer.OrderedOpts{RebalanceInterval: -1}, true},
		{"negative rebalance", consumer.OrderedOpts{RebalanceInterval: -2}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := tc.o
			err := consumer.RegisterSafely(consumer.NewRouter(), "q", inboxtype.HandlerFunc[seqEvent](func(context.Context, *inboxtype.Message[seqEvent]) error { return nil }),
				&consumer.HandlerOpts{Ordered: &o})
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.Error(t, err, fmt.Sprint(tc.o))
			}
		})
	}
}

// TestOrderedRequeueHoldsLaterEvents: on a classic ordered route with a
// prefetch above 1, K:1's first run ends without a final settlement while
// K:2 is already prefetched on the shard's channel and not yet admitted to
// K's lane (the shard loop is busy handing X:1 to the single worker). K:1
// still runs again before K:2, whichever way its first run ended (and so
// on a quorum route, whose shards have a prefetch of 1):
//   - its settlement failed (its OnDeadLetter hook failed: requeued);
//   - Stop cut its in-process retry short (requeued), and the next
//     worker took the shard;
//   - the connection was lost under it (abandoned, redelivered).
func TestOrderedRequeueHoldsLaterEvents(t *testing.T) {
	t.Parallel()
	amqptest.RequireConsistentHash(t)
	for _, tc := range []struct {
		name string
		// first is K:1's first run's result; onDeadLetter the route's
		// hook; after ends that run, with release, and brings K:1 back.
		first        error
		onDeadLetter func(context.Context, consumer.DeadLetter) error
		after        func(t *testing.T, b *requeueBundle, release func())
	}{
		{
			name:  "settlement fails",
			first: retry.Permanent(errors.New("declined")),
			onDeadLetter: func(context.Context, consumer.DeadLetter) error {
				return errors.New("outbox unavailable") // the dead letter is not settled: requeued
			},
			after: func(_ *testing.T, _ *requeueBundle, release func()) { release() },
		},
		{
			name:  "stop",
			first: errors.New("blip"), // retried in process after a long pause
			after: func(t *testing.T, b *requeueBundle, release func()) {
				release()
				b.stop(t, b.c)
				b.start(t, b.router, nil)
			},
		},
		{
			name:  "connection lost",
			first: nil,
			after: func(t *testing.T, b *requeueBundle, release func()) {
				amqptest.CloseConnection(t, "inboxmq-test-"+b.queue)
				b.rec.waitState(t, inboxtype.ConnDisconnected)
				release() // its ack goes to the lost channel
			},
		},
	} {
		for _, typ := range []consumer.QueueType{consumer.Classic, consumer.Quorum} {
			t.Run(string(typ)+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				b := setupRequeue(t, typ, tc.first, tc.onDeadLetter)
				b.publishBurst(t, []seqEvent{{Key: "K", Seq: 1}, {Key: "X", Seq: 1}, {Key: "K", Seq: 2}})
				testenv.WaitChan(t, b.held, "K:1 running")
				ready := 0 // X:1 and K:2 prefetched
				if typ == consumer.Quorum {
					ready = 2 // prefetch 1: only K:1 is out
				}
				shard := consumer.ShardQueueName(b.queue, 0)
				testenv.WaitFor(t, "the shard's prefetch taken", func() bool { return amqptest.Depth(t, b.conn, shard) == ready })
				tc.after(t, b, sync.OnceFunc(func() { close(b.release) }))

				testenv.WaitFor(t, "K:1 run again, X:1 and K:2 run", func() bool {
					seen := b.seen()
					return slices.Contains(seen, "K:2") && slices.Contains(seen, "X:1") && slices.Contains(seen[1:], "K:1")
				})
				seen := b.seen()
				second := slices.Index(seen[1:], "K:1") + 1
				require.Less(t, second, slices.Index(seen, "K:2"), "K:1's second run comes before K:2: %v", seen)
			})
		}
	}
}

// requeueBundle is an ordered route of one shard (prefetch 8 on a
// classic queue) and one worker, whose handler records the events it sees and holds K:1's
// first run until release is closed.
type requeueBundle struct {
	*orderedBundle
	c       *consumer.Consumer
	held    chan struct{}
	release chan struct{}
	mu      sync.Mutex
	log     []string
}

func setupRequeue(t *testing.T, typ consumer.QueueType, first error, onDeadLetter func(context.Context, consumer.DeadLetter) error) *requeueBundle {
	t.Helper()
	b := &requeueBundle{
		orderedBundle: &orderedBundle{testBundle: setup(t), shards: 1, router: consumer.NewRouter()},
		held:          make(chan struct{}, 1),
		release:       make(chan struct{}),
	}
	amqptest.DeleteOrderedAtCleanup(t, b.conn, b.queue, 1)
	consumer.Register(b.router, b.queue, inboxtype.HandlerFunc[seqEvent](func(_ context.Context, m *inboxtype.Message[seqEvent]) error {
		id := m.Body.IdempotencyKey()
		b.mu.Lock()
		again := slices.Contains(b.log, id)
		b.log = append(b.log, id)
		b.mu.Unlock()
		if id == "K:1" && !again {
			b.held <- struct{}{}
			<-b.release
			return first
		}
		return nil
	}), &consumer.HandlerOpts{
		Queue:        consumer.QueueOpts{Type: typ, Prefetch: 8, Concurrency: 1},
		Ordered:      &consumer.OrderedOpts{Shards: 1, RebalanceInterval: -1, MaxRetryDelay: time.Hour},
		Policy:       retry.Exponential{InitialInterval: time.Hour, RandomizationFactor: -1, MaxAttempts: 5},
		OnDeadLetter: onDeadLetter,
	})
	b.c = b.start(t, b.router, nil)
	return b
}

func (b *requeueBundle) seen() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.log)
}
