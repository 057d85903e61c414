package inboxmq_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/lock"
	"github.com/inboxmq/inboxmq/internal/redistest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// fakeGateway is an HTTP downstream that answers 503 while it is down and
// records when each call came (and from which worker).
type fakeGateway struct {
	srv *httptest.Server

	mu       sync.Mutex
	down     bool
	downAt   time.Time // the first 503
	upAt     time.Time // when it recovered
	outage   time.Duration
	calls    []time.Time
	byWorker map[string][]time.Time
	failed   int // calls answered 503
}

// newFakeGateway starts a gateway; with outage > 0 it is down from the
// start until outage after its first call.
func newFakeGateway(t *testing.T, outage time.Duration) *fakeGateway {
	t.Helper()
	g := &fakeGateway{down: outage > 0, outage: outage, byWorker: map[string][]time.Time{}}
	g.srv = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		now := time.Now()
		g.calls = append(g.calls, now)
		g.byWorker[r.Header.Get("X-Worker")] = append(g.byWorker[r.Header.Get("X-Worker")], now)
		if g.down && g.downAt.IsZero() {
			g.downAt = now
		}
		if g.down && now.Sub(g.downAt) >= g.outage {
			g.down, g.upAt = false, now
		}
		down := g.down
		if down {
			g.failed++
		}
		g.mu.Unlock()
		if down {
			rw.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		rw.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(g.srv.Close)
	return g
}

// charge calls the gateway; a 503 is a retryable error.
func (g *fakeGateway) charge(ctx context.Context, worker string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.srv.URL+"/charges", http.NoBody)
	if err != nil {
		return err
	}
	req.Header.Set("X-Worker", worker)
	resp, err := g.srv.Client().Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("gateway: %s", resp.Status)
	}
	return nil
}

func (g *fakeGateway) failedCalls() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.failed
}

func (g *fakeGateway) recovered() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.upAt.IsZero()
}

func (g *fakeGateway) times(worker string) []time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	if worker == "" {
		return append([]time.Time(nil), g.calls...)
	}
	return append([]time.Time(nil), g.byWorker[worker]...)
}

// The settings of the breaker tests, scaled down from the 30s
// outage so the test runs in seconds.
const (
	outage          = 5 * time.Second
	breakerCoolDown = time.Second
	breakerMinCalls = 5
	outageOrders    = 30
	concurrency     = 4
	maxAttempts     = 3
)

// outageWorker runs a worker whose handler charges g for each order, with
// a small attempt budget, and the breaker when breaker is set.
func outageWorker(t *testing.T, b *testBundle, g *fakeGateway, breaker *inboxmq.BreakerOpts, reg *prometheus.Registry) {
	t.Helper()
	outageWorkerLocked(t, b, g, breaker, reg, nil)
}

// outageWorkerLocked is outageWorker with the Redis lock on rdb when rdb
// is set.
func outageWorkerLocked(t *testing.T, b *testBundle, g *fakeGateway, breaker *inboxmq.BreakerOpts, reg *prometheus.Registry, rdb redis.UniversalClient) {
	t.Helper()
	var lock *inboxmq.LockOpts
	if rdb != nil {
		lock = &inboxmq.LockOpts{}
	}
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if err := g.charge(ctx, "w"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, msg.Body.ID)
		return err
	}, &inboxmq.RouteOpts{
		Concurrency: concurrency,
		Queue:       &inboxmq.QueueOpts{RetryTiers: []time.Duration{200 * time.Millisecond, 500 * time.Millisecond, time.Second}},
		Retry:       retry.Exponential{InitialInterval: 200 * time.Millisecond, RandomizationFactor: -1, MaxAttempts: maxAttempts},
		InProcess:   retry.InProcess{Tries: -1},
		Breaker:     breaker,
		Lock:        lock,
	})
	w, err := inboxmq.NewWorker(&inboxmq.Config{
		URL: testenv.AMQPURL(), DB: b.pool, Routes: routes, Name: "w-" + b.queue,
		Registerer: reg, Redis: rdb,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	require.NoError(t, w.Start(t.Context()))
	for i := range outageOrders {
		b.pub.Publish(b.queue, fmt.Appendf(nil, `{"id":"o%d"}`, i), amqp.Publishing{MessageId: fmt.Sprintf("m%d", i)})
	}
}

// A gateway that answers 503 for 5s (the 30s, scaled down with the
// breaker's cool-down) and then recovers: behind the breaker no message
// reaches the DLQ, every order is charged once it is back, and the calls
// during the outage are bounded by what the breaker lets through.
func TestWorker_BreakerSparesAttemptsDuringOutage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g := newFakeGateway(t, outage)
	reg := prometheus.NewRegistry()
	outageWorker(t, b, g, &inboxmq.BreakerOpts{
		Downstream: "gateway", Window: 2 * time.Second, Threshold: 0.5, MinCalls: breakerMinCalls, CoolDown: breakerCoolDown,
	}, reg)

	// The state is visible where inboxctl reads it.
	testenv.WaitFor(t, "the breaker's open state published", func() bool {
		return b.count(t, `SELECT count(*) FROM inboxmq_breakers WHERE downstream = 'gateway' AND state <> 'closed'`) == 1
	})
	// Open means paused: the worker's broker consumer is cancelled.
	testenv.WaitFor(t, "the queue paused by the breaker", func() bool { return consumers(t, b.conn, b.queue) == 0 })
	testenv.WaitFor(t, "the gateway recovers", g.recovered)
	testenv.WaitFor(t, "every order is charged", func() bool {
		return b.count(t, `SELECT count(*) FROM effects`) == outageOrders
	})
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue+".dlq"), "nothing dead-lettered")

	// Before the trip: MinCalls failures, plus the concurrency-1 calls
	// already running; then one probe per cool-down, plus one at the end.
	bound := breakerMinCalls + concurrency - 1 + int(outage/breakerCoolDown) + 1
	require.LessOrEqual(t, g.failedCalls(), bound, "calls during the outage")
	t.Logf("gateway calls during the %s outage: %d (bound %d; %d without a breaker would be %d)",
		outage, g.failedCalls(), bound, outageOrders, outageOrders*maxAttempts)

	testenv.WaitFor(t, "the breaker closed", func() bool {
		return b.count(t, `SELECT count(*) FROM inboxmq_breakers WHERE downstream = 'gateway' AND state = 'closed'`) == 1
	})
	opened := value(t, reg, "inboxmq_breaker_transitions_total", map[string]string{"queue": b.queue, "downstream": "gateway", "to": "open"})
	require.GreaterOrEqual(t, opened, 1.0)
	require.Zero(t, value(t, reg, "inboxmq_breaker_state", map[string]string{"queue": b.queue, "downstream": "gateway"}), "closed")
}

// Behind the breaker, a delivery it holds back takes no Redis lock: every
// lock obtained (each key's fence counter counts its obtains) led to a call
// of the handler, while deliveries were held back.
func TestWorker_BreakerHoldsBackBeforeTheLock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	rdb := redisFor(t, b.queue)
	g := newFakeGateway(t, outage)
	reg := prometheus.NewRegistry()
	outageWorkerLocked(t, b, g, &inboxmq.BreakerOpts{
		Downstream: "gateway", Window: 2 * time.Second, Threshold: 0.5, MinCalls: breakerMinCalls, CoolDown: breakerCoolDown,
	}, reg, rdb)
	testenv.WaitFor(t, "every order is charged", func() bool {
		return b.count(t, `SELECT count(*) FROM effects`) == outageOrders
	})
	require.Positive(t, sumByLabel(t, reg, "reason", "breaker_open"), "deliveries held back by the breaker")

	obtains := 0
	for i := range outageOrders {
		_, fence := lock.RedisKeys("inboxmq:lock:" + b.queue + ":" + fmt.Sprintf("order:o%d", i))
		n, err := rdb.Get(ctx, fence).Int()
		require.NoError(t, err, fence)
		obtains += n
	}
	require.Equal(t, len(g.times("")), obtains, "one obtain per handler call, none for a held-back delivery")
}

// sumByLabel sums the counters and gauges of reg whose label name has
// value.
func sumByLabel(t *testing.T, reg *prometheus.Registry, name, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == name && l.GetValue() == value {
					sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
	}
	return sum
}

// The same dead gateway without the breaker: every order spends its
// attempts on it and is dead-lettered. (The gateway stays down until then:
// on an idle machine that takes about a second, well within the other
// test's 5s outage, but a loaded one may need longer, and an order whose
// last attempt came after a recovery would not be dead-lettered.)
func TestWorker_WithoutBreakerOutageExhaustsAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g := newFakeGateway(t, time.Hour)
	outageWorker(t, b, g, nil, prometheus.NewRegistry())
	testenv.WaitFor(t, "every order dead-lettered", func() bool {
		return amqptest.DepthOrZero(t, b.conn, b.queue+".dlq") == outageOrders
	})
	require.Equal(t, outageOrders*maxAttempts, g.failedCalls(), "each order burnt its whole budget on the outage")
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM effects`))
}

// consumers returns the number of broker consumers of queue.
func consumers(t *testing.T, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	return q.Consumers
}

// value reads one series from reg.
func value(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("series %s%v not found", name, labels)
	return 0
}

// limitedWorkers runs three workers on one queue whose handler charges g,
// every one limited to rate calls per second on "gateway" through rdb.
func limitedWorkers(t *testing.T, b *testBundle, g *fakeGateway, rdb redis.UniversalClient, prefix string, rate float64, expected int) []*prometheus.Registry {
	t.Helper()
	var regs []*prometheus.Registry
	for i := range 3 {
		name := fmt.Sprintf("w%d", i)
		routes := inboxmq.NewRoutes()
		inboxmq.HandleTx(routes, b.queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
			if err := g.charge(ctx, name); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, msg.Body.ID)
			return err
		}, &inboxmq.RouteOpts{
			Concurrency: 8,
			RateLimit:   &inboxmq.RateLimitOpts{Downstream: "gateway-" + b.queue, Rate: rate, ExpectedWorkers: expected},
		})
		reg := prometheus.NewRegistry()
		regs = append(regs, reg)
		w, err := inboxmq.NewWorker(&inboxmq.Config{
			URL: testenv.AMQPURL(), DB: b.pool, Redis: rdb, Routes: routes, Name: name,
			Registerer: reg,
		})
		require.NoError(t, err)
		t.Cleanup(func() { _ = w.Stop(context.Background()) })
		require.NoError(t, w.Start(t.Context()))
	}
	return regs
}

// Three workers share a limit of 50 calls/s on the gateway through Redis:
// the 150 calls spread over at least 2.5s (their slots, 20ms apart after
// GCRA's burst of one, span 2.96s; a call can only be later than its
// slot, so only the first call's lateness shortens the spread), and no 1s
// window sees more than 75 — 50, +1 for the burst, and up to half a
// second of calls bunched by their lateness (a timer's wake-up and an
// inbox insert on a loaded CI machine: 64 seen) — and every order is
// charged, nothing dead-lettered. Unlimited, or each worker at the whole
// rate, would be 150 within about one second.
func TestWorker_RateLimitSharedByThreeWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rdb, prefix := redistest.Client(t)
	g := newFakeGateway(t, 0)
	regs := limitedWorkers(t, b, g, rdb, prefix, 50, 3)
	const orders = 150
	for i := range orders {
		b.pub.Publish(b.queue, fmt.Appendf(nil, `{"id":"o%d"}`, i), amqp.Publishing{MessageId: fmt.Sprintf("m%d", i)})
	}
	testenv.WaitFor(t, "every order charged", func() bool { return b.count(t, `SELECT count(*) FROM effects`) == orders })
	require.Equal(t, 0, amqptest.DepthOrZero(t, b.conn, b.queue+".dlq"), "nothing dead-lettered")
	times := g.times("")
	require.Len(t, times, orders, "one call per order: nothing lost, nothing repeated")
	peak := testenv.MaxInWindow(times, time.Second)
	require.LessOrEqual(t, peak, 75, "calls in the busiest 1s window")
	require.GreaterOrEqual(t, times[len(times)-1].Sub(times[0]), 2500*time.Millisecond, "the spread of 150 calls at 50/s")
	for _, w := range []string{"w0", "w1", "w2"} {
		require.NotEmpty(t, g.times(w), "worker %s took part", w)
	}
	waits := 0.0
	for _, reg := range regs {
		waits += value(t, reg, "inboxmq_ratelimit_wait_seconds", map[string]string{"downstream": "gateway-" + b.queue})
	}
	require.InDelta(t, orders, waits, 0, "each delivery's wait for its slot is observed")
	t.Logf("150 calls from 3 workers at 50/s: busiest 1s window %d, spread over %s", peak, times[len(times)-1].Sub(times[0]))
}

// With Redis unreachable each of the three workers keeps to its share,
// 30/s / 3 expected workers = 10/s: never unlimited.
func TestWorker_RateLimitWithoutRedisKeepsWorkerShare(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // a closed port: Redis is down
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	g := newFakeGateway(t, 0)
	limitedWorkers(t, b, g, rdb, "", 30, 3)
	const orders = 60
	for i := range orders {
		b.pub.Publish(b.queue, fmt.Appendf(nil, `{"id":"o%d"}`, i), amqp.Publishing{MessageId: fmt.Sprintf("m%d", i)})
	}
	testenv.WaitFor(t, "every order charged", func() bool { return b.count(t, `SELECT count(*) FROM effects`) == orders })
	require.Equal(t, 0, amqptest.DepthOrZero(t, b.conn, b.queue+".dlq"))
	for _, w := range []string{"w0", "w1", "w2"} {
		times := g.times(w)
		if len(times) == 0 {
			continue // RabbitMQ may hand one worker nothing
		}
		// A share of 10/s with a burst of 1: at most 11 in any 1s, +5
		// for calls up to 500ms late on a loaded machine (slots are 100ms
		// apart).
		require.LessOrEqual(t, testenv.MaxInWindow(times, time.Second), 16, "worker %s", w)
	}
	// The whole rate per worker would put all 60 in one window.
	require.LessOrEqual(t, testenv.MaxInWindow(g.times(""), time.Second), 46, "together about 30/s")
}

// An operator's pause (inboxctl pause) and the breaker's are kept apart:
// the breaker reaching half-open does not resume a queue the operator
// paused, and the operator's resume lets the probe through, which closes
// the breaker.
func TestWorker_BreakerNeverLiftsAnOperatorPause(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g := newFakeGateway(t, time.Hour) // down until the test says otherwise
	outageWorker(t, b, g, &inboxmq.BreakerOpts{
		Downstream: "gateway", Window: 2 * time.Second, Threshold: 0.5, MinCalls: breakerMinCalls, CoolDown: 500 * time.Millisecond,
	}, prometheus.NewRegistry())
	breaker := func() string {
		var s string
		_ = b.pool.QueryRow(t.Context(), `SELECT state FROM inboxmq_breakers WHERE downstream = 'gateway'`).Scan(&s)
		return s
	}
	testenv.WaitFor(t, "the breaker opens", func() bool { return breaker() == "open" })
	store := control.NewStore(b.pool)
	require.NoError(t, store.Pause(t.Context(), b.queue, &control.ChangeOpts{By: "test", Reason: "gateway incident"}))
	g.mu.Lock()
	g.down, g.upAt = false, time.Now() // the gateway is back, but the operator keeps the queue paused
	g.mu.Unlock()
	testenv.WaitFor(t, "the breaker's cool-down ends", func() bool { return breaker() == "half-open" })
	testenv.WaitFor(t, "the queue has no consumer", func() bool { return consumers(t, b.conn, b.queue) == 0 })
	charged := b.count(t, `SELECT count(*) FROM effects`)
	select {
	case <-time.After(time.Second): // a negative check needs a bound: two cool-downs
	case <-t.Context().Done():
	}
	require.Equal(t, 0, consumers(t, b.conn, b.queue), "still paused: the breaker never lifts the operator's pause")
	require.Equal(t, charged, b.count(t, `SELECT count(*) FROM effects`), "nothing processed while the operator's pause holds")
	require.Equal(t, "half-open", breaker())

	require.NoError(t, store.Resume(t.Context(), b.queue, nil))
	testenv.WaitFor(t, "the probe succeeds and every order is charged", func() bool {
		return breaker() == "closed" && b.count(t, `SELECT count(*) FROM effects`) == outageOrders
	})
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue+".dlq"))
}
