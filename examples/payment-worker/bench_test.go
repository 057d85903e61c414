package main

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/producer"
)

// outgoing is one message a test publishes: a payment (typed, with
// producer.Publish) or a raw body (with Producer.Send), to routingKey.
type outgoing struct {
	payment    *Payment
	raw        []byte
	routingKey string
}

// publishAll publishes msgs to exchange with b's producer, sixteen at a
// time, each under a message id of its own (the inbox deduplicates by key,
// never by id), and requires every publish confirmed.
func (b *testBundle) publishAll(tb testing.TB, exchange string, msgs []outgoing) {
	tb.Helper()
	ctx, cancel := context.WithCancelCause(tb.Context())
	defer cancel(nil)
	next := make(chan outgoing)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for m := range next {
				var err error
				if m.payment != nil {
					err = producer.Publish(ctx, b.prod, exchange, m.routingKey, *m.payment, &producer.PublishOpts{MessageID: newID()})
				} else {
					err = b.prod.Send(ctx, &producer.Message{Exchange: exchange, RoutingKey: m.routingKey, ID: newID(), ContentType: "application/json", Body: m.raw})
				}
				if err != nil {
					cancel(err)
				}
			}
		})
	}
	for _, m := range msgs {
		select {
		case next <- m:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	require.NoError(tb, context.Cause(ctx))
}

// BenchmarkWorkerDrain measures the whole path end to end: one
// payment-worker process (transactional mode, WORKER_CONCURRENCY=8) drains
// a burst per iteration — burstOrders orders, each published twice under
// different message ids with package producer (sixteen publishes in
// flight). It reports deliveries per second from the first publish to the
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
				msgs = append(msgs, outgoing{payment: p, routingKey: tb.queue})
			}
		}
		dupsBefore := int(w.metricSum(b, "duplicate_detected_total"))

		start := time.Now()
		tb.publishAll(b, "", msgs)
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
