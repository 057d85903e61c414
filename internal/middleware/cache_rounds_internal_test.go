package middleware

import (
	"context"
	"encoding/hex"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/redistest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// roundHook counts the round trips a client makes for the cache's GETs
// and SETs (a command or a pipeline is one) and lets a test hold them: hold, if set, runs before
// each round trip is sent.
type roundHook struct {
	trips atomic.Int64
	cmds  atomic.Int64 // commands in those round trips
	hold  func(ctx context.Context, first string)
}

func (h *roundHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *roundHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !cacheCommand(cmd) {
			return next(ctx, cmd)
		}
		h.trips.Add(1)
		h.cmds.Add(1)
		if h.hold != nil {
			h.hold(ctx, cacheName(cmd))
		}
		return next(ctx, cmd)
	}
}

func (h *roundHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) == 0 || !cacheCommand(cmds[0]) {
			return next(ctx, cmds)
		}
		h.trips.Add(1)
		h.cmds.Add(int64(len(cmds)))
		if h.hold != nil {
			h.hold(ctx, cacheName(cmds[0]))
		}
		return next(ctx, cmds)
	}
}

// cacheCommand reports whether cmd is one the cache sends (the client's
// own, such as the HELLO of a new connection, and the tests' assertions
// made through the same client are not counted).
func cacheCommand(cmd redis.Cmder) bool {
	name := cacheName(cmd)
	return name == "get" || name == "set"
}

// cacheName is cmd's name, "get" for the MGET of a lone read.
func cacheName(cmd redis.Cmder) string {
	if name := cmd.Name(); name != "mget" {
		return name
	}
	return "get"
}

// roundDelivery returns a decoded delivery of consumer "svc" with key and
// the fingerprint "fp:" + key.
func roundDelivery(key string) *inboxtype.Delivery {
	d := inboxtype.NewDelivery("payments", "svc", "worker-1", &amqp.Delivery{MessageId: "m-" + key})
	d.Key = key
	d.Fingerprint = []byte("fp:" + key)
	return d
}

// runConcurrently runs the deliveries k0..k(n-1) through h, each on its
// own goroutine, and returns their errors once all are done.
func runConcurrently(ctx context.Context, h inboxtype.DeliveryHandler, n int) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = h(ctx, roundDelivery("k"+strconv.Itoa(i))) })
	}
	wg.Wait()
	return errs
}

// Concurrent deliveries share the cache's round trips: while the first
// delivery's GET is held, the other deliveries' GETs queue and go out in
// one pipeline; the same for the SETs. Every delivery still gets its own
// answer: hits only for its own fingerprint, entries written for the
// others.
func TestCache_ConcurrentDeliveriesShareRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	rdb, prefix := redistest.Client(t)
	const n = 32
	// Every fourth key is completed already; k1 holds another job's entry.
	for i := 0; i < n; i += 4 {
		require.NoError(t, rdb.Set(ctx, prefix+"svc:k"+strconv.Itoa(i), hex.EncodeToString([]byte("fp:k"+strconv.Itoa(i))), time.Minute).Err())
	}
	require.NoError(t, rdb.Set(ctx, prefix+"svc:k1", hex.EncodeToString([]byte("another job")), time.Minute).Err())

	release := map[string]chan struct{}{"get": make(chan struct{}), "set": make(chan struct{})}
	var held sync.Map // command name -> true once its first round was held
	hook := &roundHook{hold: func(ctx context.Context, name string) {
		if ch, ok := release[name]; ok {
			if _, loaded := held.LoadOrStore(name, true); !loaded {
				select {
				case <-ch:
				case <-ctx.Done():
				}
			}
		}
	}}
	rdb.AddHook(hook)
	m := newCache(rdb, &CacheOpts{Prefix: prefix, TTL: time.Minute, CallTimeout: testenv.Timeout()})
	var calls atomic.Int64
	h := m.wrap(func(context.Context, *inboxtype.Delivery) error {
		calls.Add(1)
		return nil
	})

	done := make(chan []error, 1)
	go func() { done <- runConcurrently(ctx, h, n) }()
	testenv.WaitFor(t, "the other GETs queue behind the first", func() bool { return m.rounds.reads.Queued() == n-1 })
	close(release["get"])
	misses := n - n/4
	testenv.WaitFor(t, "the other SETs queue behind the first", func() bool { return m.rounds.writes.Queued() == misses-1 })
	close(release["set"])
	errs := testenv.WaitChan(t, done, "the deliveries")
	// One GET alone, one pipeline of the n-1 others; one SET alone, one
	// pipeline of the other misses.
	require.Equal(t, int64(4), hook.trips.Load(), "round trips for %d deliveries", n)
	// On one server the queued reads are one MGET; the SETs one each.
	require.Equal(t, int64(2+misses), hook.cmds.Load(), "commands for %d deliveries", n)

	for i, err := range errs {
		if i%4 == 0 {
			require.Equal(t, retry.SourceCache, retry.Classify(err).Source, "k%d is a hit", i)
			continue
		}
		require.NoError(t, err, "k%d", i)
		val, gerr := rdb.Get(ctx, prefix+"svc:k"+strconv.Itoa(i)).Result()
		require.NoError(t, gerr)
		require.Equal(t, hex.EncodeToString([]byte("fp:k"+strconv.Itoa(i))), val, "k%d's entry is its own job's", i)
	}
	require.Equal(t, int64(misses), calls.Load(), "the handler runs for the misses only (k1's entry is another job's)")
	require.False(t, m.health.degraded.Load())
}

// A Redis that does not answer: the first GET hangs until its
// CallTimeout, the GETs queued behind it give up by their own deadline
// (or go out in a round bounded by the earliest of them), every delivery
// goes on to next (the inbox decides), and OnDegraded(true) is called
// once, however many deliveries saw the failure.
func TestCache_ConcurrentDeliveriesTimeOutTogether(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	rdb, prefix := redistest.Client(t)
	const n = 16
	for i := range n { // all completed: only a hang makes them reach next
		require.NoError(t, rdb.Set(ctx, prefix+"svc:k"+strconv.Itoa(i), hex.EncodeToString([]byte("fp:k"+strconv.Itoa(i))), time.Minute).Err())
	}
	queued := make(chan struct{})
	var first atomic.Bool
	hook := &roundHook{hold: func(ctx context.Context, _ string) {
		if first.CompareAndSwap(false, true) {
			<-queued
		}
		<-ctx.Done() // hangs: the command is not sent before its round ends
	}}
	rdb.AddHook(hook)
	events := make(chan bool, n)
	m := newCache(rdb, &CacheOpts{Prefix: prefix, CallTimeout: time.Second, OnDegraded: func(d bool) { events <- d }})
	var calls atomic.Int64
	h := m.wrap(func(context.Context, *inboxtype.Delivery) error {
		calls.Add(1)
		return nil
	})

	done := make(chan []error, 1)
	go func() { done <- runConcurrently(ctx, h, n) }()
	testenv.WaitFor(t, "the other GETs queue behind the first", func() bool { return m.rounds.reads.Queued() == n-1 })
	close(queued)
	errs := testenv.WaitChan(t, done, "the deliveries")

	for i, err := range errs {
		require.NoError(t, err, "k%d goes on without the cache", i)
	}
	require.Equal(t, int64(n), calls.Load(), "every delivery reaches next")
	require.True(t, testenv.WaitChan(t, events, "OnDegraded(true)"))
	require.Empty(t, events, "OnDegraded once per change")
	require.Less(t, hook.trips.Load(), int64(n), "the queued GETs were not sent one by one")
}

// A delivery whose own context ends while its GET is queued is withdrawn:
// not sent, not a Redis fault.
func TestCache_CancelledWhileQueuedIsNotAFault(t *testing.T) {
	t.Parallel()
	rdb, prefix := redistest.Client(t)
	release := make(chan struct{})
	var first atomic.Bool
	hook := &roundHook{hold: func(context.Context, string) {
		if first.CompareAndSwap(false, true) {
			<-release
		}
	}}
	rdb.AddHook(hook)
	events := make(chan bool, 4)
	m := newCache(rdb, &CacheOpts{Prefix: prefix, CallTimeout: testenv.Timeout(), OnDegraded: func(d bool) { events <- d }})
	h := m.wrap(func(context.Context, *inboxtype.Delivery) error { return nil })

	firstDone := make(chan error, 1)
	go func() { firstDone <- h(t.Context(), roundDelivery("a")) }()
	testenv.WaitFor(t, "the first GET in flight", first.Load)
	cctx, cancel := context.WithCancel(t.Context())
	secondDone := make(chan error, 1)
	go func() { secondDone <- h(cctx, roundDelivery("b")) }()
	testenv.WaitFor(t, "the second GET queued", func() bool { return m.rounds.reads.Queued() == 1 })
	cancel()
	require.NoError(t, testenv.WaitChan(t, secondDone, "the cancelled delivery"))
	close(release)
	require.NoError(t, testenv.WaitChan(t, firstDone, "the first delivery"))
	require.Empty(t, events, "a cancelled delivery is no Redis fault")
	require.False(t, m.health.degraded.Load())
	// a: GET, SET. b: its GET withdrawn; its SET (the effect committed
	// though its context ended) sent.
	require.Equal(t, int64(3), hook.trips.Load())
}

// On a Redis Cluster the shared rounds are plain pipelines, which the
// client splits by node: the GETs and SETs of keys in different slots go
// out together (a MULTI of them would be refused with CROSSSLOT), and each
// delivery gets its own answer.
func TestCache_SharedRoundsOnRedisCluster(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	node := redistest.StartCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{node.Addr()}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	prefix := "t:" + strconv.FormatInt(time.Now().UnixNano(), 10) + ":"
	const n = 8
	s0, err := rdb.ClusterKeySlot(ctx, prefix+"svc:k0").Result()
	require.NoError(t, err)
	s1, err := rdb.ClusterKeySlot(ctx, prefix+"svc:k1").Result()
	require.NoError(t, err)
	require.NotEqual(t, s0, s1, "the keys are in different slots")
	require.NoError(t, rdb.Set(ctx, prefix+"svc:k0", hex.EncodeToString([]byte("fp:k0")), time.Minute).Err())

	release := make(chan struct{})
	var first atomic.Bool
	hook := &roundHook{hold: func(context.Context, string) {
		if first.CompareAndSwap(false, true) {
			<-release
		}
	}}
	rdb.AddHook(hook)
	m := newCache(rdb, &CacheOpts{Prefix: prefix, TTL: time.Minute, CallTimeout: testenv.Timeout()})
	h := m.wrap(func(context.Context, *inboxtype.Delivery) error { return nil })

	done := make(chan []error, 1)
	go func() { done <- runConcurrently(ctx, h, n) }()
	testenv.WaitFor(t, "the other GETs queue behind the first", func() bool { return m.rounds.reads.Queued() == n-1 })
	close(release)
	errs := testenv.WaitChan(t, done, "the deliveries")
	for i, err := range errs {
		if i == 0 {
			require.Equal(t, retry.SourceCache, retry.Classify(err).Source, "k0 is a hit")
			continue
		}
		require.NoError(t, err, "k%d", i)
		val, gerr := rdb.Get(ctx, prefix+"svc:k"+strconv.Itoa(i)).Result()
		require.NoError(t, gerr, "k%d", i)
		require.Equal(t, hex.EncodeToString([]byte("fp:k"+strconv.Itoa(i))), val, "k%d", i)
	}
	require.False(t, m.health.degraded.Load(), "no round failed")
}
