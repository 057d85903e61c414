package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/testenv"
)

// BenchmarkWorkerDrain measures the whole path end to end: one
// payment-worker process (transactional mode, Redis lock and cache,
// WORKER_CONCURRENCY=8) drains a burst per iteration — burstOrders orders,
// each published twice under different message ids with package producer
// (sixteen publishes in flight). It reports deliveries per second from the first publish to the
// last effect, and checks one effect per order.
func BenchmarkWorkerDrain(b *testing.B) {
	const burstOrders = 250
	tb := setup(b, "WORKER_CONCURRENCY=8")
	tb.migrate(b)
	w := tb.start(b)
	b.ResetTimer()

	var deliveries int
	var elapsed time.Duration
	for i := range b.N {
		prefix := fmt.Sprintf("bench%d", i)
		msgs := make([]outgoing, 0, 2*burstOrders)
		for j := range burstOrders {
			p := &Payment{OrderID: fmt.Sprintf("%s-%05d", prefix, j), AmountCents: 100, Currency: "EUR"}
			for range 2 {
				msgs = append(msgs, outgoing{payment: p, id: newID()})
			}
		}
		dupsBefore := int(w.metricSum(b, "duplicate_detected_total"))

		start := time.Now()
		require.NoError(b, publishAll(b.Context(), testenv.AMQPURL(), tb.queue, msgs))
		testenv.WaitFor(b, "every delivery of the burst is processed", func() bool {
			return tb.count(b, `SELECT count(*) FROM payments WHERE order_id LIKE $1`, prefix+"-%") >= burstOrders &&
				int(w.metricSum(b, "duplicate_detected_total"))-dupsBefore >= burstOrders
		})
		elapsed += time.Since(start)
		deliveries += len(msgs)

		b.StopTimer()
		tb.requireOneEffectPerOrder(b, prefix, burstOrders)
		b.StartTimer()
	}
	b.ReportMetric(float64(deliveries)/elapsed.Seconds(), "deliveries/s")
	b.StopTimer()
	w.stop(b)
}
