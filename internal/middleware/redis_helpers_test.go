package middleware_test

import (
	"encoding/hex"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/redistest"
)

// redisBundle is the per-test Redis state of the lock and cache tests.
type redisBundle struct {
	rdb    redis.UniversalClient // the real client, for assertions
	flaky  *redistest.Flaky      // what the middleware gets
	prefix string                // unique to the test; use as key prefix
}

func setupRedis(t testing.TB) *redisBundle {
	t.Helper()
	rdb, prefix := redistest.Client(t)
	return &redisBundle{rdb: rdb, flaky: redistest.NewFlaky(rdb), prefix: prefix}
}

// transition is one recorded Delivery.Transition call.
type transition struct {
	status inboxtype.Status
	err    error
}

// transitionRecorder is an observer that records transitions.
type transitionRecorder struct {
	inboxtype.NopObserver
	mu  sync.Mutex
	got []transition
}

func (r *transitionRecorder) OnTransition(_ *inboxtype.Delivery, status inboxtype.Status, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, transition{status: status, err: err})
}

func (r *transitionRecorder) statuses() []inboxtype.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]inboxtype.Status, 0, len(r.got))
	for _, tr := range r.got {
		out = append(out, tr.status)
	}
	return out
}

// keyedDelivery returns a decoded delivery of consumer "svc" with key, and
// a fingerprint of its own ("fp:" + key).
func keyedDelivery(key string, obs ...inboxtype.Observer) *inboxtype.Delivery {
	d := inboxtype.NewDelivery("payments", "svc", "worker-1", &amqp.Delivery{MessageId: "m-" + key}, obs...)
	d.Key = key
	d.Fingerprint = []byte("fp:" + key)
	return d
}

// cacheValue is the completed-cache entry Cache writes for d.
func cacheValue(d *inboxtype.Delivery) string { return hex.EncodeToString(d.Fingerprint) }

// degradedHook returns an OnDegraded hook that records every call on a
// buffered channel.
func degradedHook() (func(bool), chan bool) {
	ch := make(chan bool, 16)
	return func(degraded bool) { ch <- degraded }, ch
}

// runParallel8 runs fn b.N times from 8 goroutines and reports ops/s.
func runParallel8(b *testing.B, fn func(i int64) error) {
	b.Helper()
	var n atomic.Int64
	b.SetParallelism(max(1, 8/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := fn(n.Add(1)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "deliveries/s")
}

func itoa(i int64) string { return strconv.FormatInt(i, 10) }
