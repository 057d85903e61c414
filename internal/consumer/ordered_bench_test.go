package consumer_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// BenchmarkDrainOrdered drains b.N messages pre-published to an ordered
// route's exchange (8 shards) over a number of ordering keys, with one
// consumer (concurrency 8, prefetch 64) and a no-op handler. One op is
// one delivery. keys=1 is the worst case: everything runs one at a time.
func BenchmarkDrainOrdered(b *testing.B) {
	amqptest.RequireConsistentHash(b)
	for _, keys := range []int{1, 64, 4096} {
		b.Run("keys="+strconv.Itoa(keys), func(b *testing.B) {
			conn := amqptest.Dial(b)
			queue := amqptest.QueueName(b)
			const shards = 8
			amqptest.DeleteOrderedAtCleanup(b, conn, queue, shards)
			obs := &countObserver{n: int64(b.N), done: make(chan struct{})}
			r := consumer.NewRouter()
			consumer.Register(r, queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error {
				return nil
			}), &consumer.HandlerOpts{
				Queue:   consumer.QueueOpts{Concurrency: 8, Prefetch: 64},
				Ordered: &consumer.OrderedOpts{Shards: shards},
			})
			declare, err := consumer.New(&consumer.Config{URL: testenv.AMQPURL(), Router: r})
			require.NoError(b, err)
			require.NoError(b, declare.Start(context.Background()))
			require.NoError(b, declare.Stop(context.Background()))

			ch, err := conn.Channel()
			require.NoError(b, err)
			require.NoError(b, ch.Confirm(false))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			body := []byte(`{"id":"bench","amount":1}`)
			var last *amqp.DeferredConfirmation
			for i := range b.N {
				last, err = ch.PublishWithDeferredConfirmWithContext(ctx, queue, "k"+strconv.Itoa(i%keys), false, false,
					amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Transient, Body: body})
				require.NoError(b, err)
			}
			ok, err := last.WaitContext(ctx)
			require.NoError(b, err)
			require.True(b, ok)

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
	}
}
