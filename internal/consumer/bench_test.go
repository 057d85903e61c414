package consumer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// countObserver closes done after n outcomes.
type countObserver struct {
	inboxtype.NopObserver
	n     int64
	count atomic.Int64
	done  chan struct{}
}

func (o *countObserver) OnOutcome(*inboxtype.Delivery, inboxtype.Outcome) {
	if o.count.Add(1) == o.n {
		close(o.done)
	}
}

// prefill declares queue as the consumer would and publishes n messages
// with confirms.
func prefill(b *testing.B, conn *amqp.Connection, queue string, n int) {
	b.Helper()
	ch, err := conn.Channel()
	require.NoError(b, err)
	defer ch.Close()
	_, err = ch.QueueDeclare(queue, true, false, false, false, amqp.Table{
		"x-queue-type": "classic", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": queue + ".dlq",
	})
	require.NoError(b, err)
	require.NoError(b, ch.Confirm(false))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	body := []byte(`{"id":"bench","amount":1}`)
	var last *amqp.DeferredConfirmation
	for range n {
		last, err = ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false,
			amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Transient, Body: body})
		require.NoError(b, err)
	}
	ok, err := last.WaitContext(ctx) // confirms are cumulative enough for a fill
	require.NoError(b, err)
	require.True(b, ok)
	testenv.WaitFor(b, "prefill visible", func() bool { return amqptest.Depth(b, conn, queue) == n })
}

// BenchmarkDrain drains b.N pre-published messages through the consumer
// with a no-op handler, and through a hand-written amqp091 ack-only loop
// with the same prefetch, in the same run. One op is one delivery.
func BenchmarkDrain(b *testing.B) {
	b.Run("consumer", func(b *testing.B) {
		conn := amqptest.Dial(b)
		queue := amqptest.QueueName(b)
		prefill(b, conn, queue, b.N)
		obs := &countObserver{n: int64(b.N), done: make(chan struct{})}
		r := consumer.NewRouter()
		consumer.Register(r, queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error {
			return nil
		}), &consumer.HandlerOpts{Queue: consumer.QueueOpts{Concurrency: 8, Prefetch: 64}})
		c, err := consumer.New(&consumer.Config{URL: testenv.AMQPURL(), Router: r, Observers: []inboxtype.Observer{obs}})
		require.NoError(b, err)
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		require.NoError(b, c.Start(context.Background()))
		testenv.WaitChan(b, obs.done, "all deliveries settled")
		elapsed := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
		require.NoError(b, c.Stop(context.Background()))
	})
	b.Run("raw_amqp091", func(b *testing.B) {
		conn := amqptest.Dial(b)
		queue := amqptest.QueueName(b)
		prefill(b, conn, queue, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		ch, err := conn.Channel()
		require.NoError(b, err)
		require.NoError(b, ch.Qos(64, 0, false))
		deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
		require.NoError(b, err)
		for n := 0; n < b.N; n++ {
			d, ok := <-deliveries
			require.True(b, ok)
			require.NoError(b, d.Ack(false))
		}
		elapsed := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
		require.NoError(b, ch.Close())
	})
}
