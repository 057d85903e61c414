package main

import (
	"encoding/json"
	"net/http"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// timedGateway charges every order, answering 503 until down ends, and
// records when each call came.
type timedGateway struct {
	mu     sync.Mutex
	downTo time.Time
	times  []time.Time
	failed int
	paid   map[string]int
}

func (g *timedGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req Payment
	if json.NewDecoder(r.Body).Decode(&req) != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	g.times = append(g.times, now)
	if now.Before(g.downTo) {
		g.failed++
		http.Error(w, "upstream unavailable", http.StatusServiceUnavailable)
		return
	}
	g.paid[req.OrderID]++
	w.WriteHeader(http.StatusCreated)
}

func (g *timedGateway) snapshot() (times []time.Time, failed int, paid map[string]int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	paid = make(map[string]int, len(g.paid))
	for k, v := range g.paid {
		paid[k] = v
	}
	return append([]time.Time(nil), g.times...), g.failed, paid
}

// GATEWAY_RATE_LIMIT=20 shared by two workers: the gateway sees at most
// 20 calls (+1 burst, +10 for calls up to 500ms late on a loaded machine)
// in any 1s window, and every order is charged once. Each worker at the
// whole rate would put all 40 in one window.
func TestWorkerGatewayRateLimit(t *testing.T) {
	t.Parallel()
	gw := &timedGateway{paid: map[string]int{}}
	b := setup(t, "GATEWAY_URL="+newLoopbackServer(t, gw), "GATEWAY_RATE_LIMIT=20", "GATEWAY_WORKERS=2")
	b.migrate(t)
	w1, w2 := b.start(t), b.start(t)
	const orders = 40
	b.publishOrders(t, "rl", orders, 1)
	testenv.WaitFor(t, "every order charged", func() bool {
		return b.count(t, `SELECT count(*) FROM payments`) == orders
	})
	b.requireOneEffectPerOrder(t, "rl", orders)
	times, _, paid := gw.snapshot()
	require.Len(t, paid, orders)
	require.LessOrEqual(t, testenv.MaxInWindow(times, time.Second), 31, "calls in the busiest 1s window")
	require.Equal(t, 0, amqptest.DepthOrZero(t, b.conn, b.queue+".dlq"))
	w1.stop(t)
	w2.stop(t)
}

// BREAKER=on and a gateway down for 3s: the breaker opens, holds the
// payments back and closes once a probe succeeds; every order is charged
// once and nothing is dead-lettered.
func TestWorkerBreakerOnGatewayOutage(t *testing.T) {
	t.Parallel()
	gw := &timedGateway{paid: map[string]int{}, downTo: time.Now().Add(time.Hour)}
	b := setup(t, "GATEWAY_URL="+newLoopbackServer(t, gw),
		"BREAKER=on", "BREAKER_WINDOW=2s", "BREAKER_MIN_CALLS=5", "BREAKER_COOLDOWN=1s")
	b.migrate(t)
	w := b.start(t)
	gw.mu.Lock()
	gw.downTo = time.Now().Add(3 * time.Second)
	gw.mu.Unlock()
	const orders = 30
	b.publishOrders(t, "br", orders, 1)
	opened := regexp.MustCompile(`(?m)^inboxmq_breaker_transitions_total\{downstream="gateway",queue="` +
		regexp.QuoteMeta(b.queue) + `",to="open"\} [1-9]`)
	testenv.WaitFor(t, "the breaker opened", func() bool { return opened.MatchString(w.metrics(t)) })
	testenv.WaitFor(t, "every order charged", func() bool {
		return b.count(t, `SELECT count(*) FROM payments`) == orders
	})
	b.requireOneEffectPerOrder(t, "br", orders)
	_, failed, _ := gw.snapshot()
	// MinCalls, plus the 3 others running at the trip, plus a probe per
	// cool-down and one at the end.
	require.LessOrEqual(t, failed, 5+3+3+1, "gateway calls during the outage")
	require.Equal(t, 0, amqptest.DepthOrZero(t, b.conn, b.queue+".dlq"))
	w.stop(t)
}
