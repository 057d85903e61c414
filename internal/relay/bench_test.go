package relay

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/outbox"
)

var benchBody = []byte(`{"payment":"00000000-0000-0000-0000-000000000042","amount":1250,"currency":"EUR","status":"captured"}`)

// benchSetup gives a benchmark its own schema and queue.
func benchSetup(b *testing.B) (*pgxpool.Pool, *amqp.Connection, string) {
	b.Helper()
	pool, _ := pgtest.Schema(b)
	conn := amqptest.Dial(b)
	q := amqptest.QueueName(b)
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-expires": int32(600000)}); err != nil {
		b.Fatal(err)
	}
	return pool, conn, q
}

func purge(b *testing.B, conn *amqp.Connection, q string) {
	b.Helper()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueuePurge(q, false); err != nil {
		b.Fatal(err)
	}
}

// rawConfirmLoop publishes n persistent, mandatory messages in windows of
// window, waiting for each window's confirms: the ceiling for the relay.
func rawConfirmLoop(b *testing.B, conn *amqp.Connection, q string, n, window int) time.Duration {
	b.Helper()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	dcs := make([]*amqp.DeferredConfirmation, 0, window)
	start := time.Now()
	for i := 0; i < n; {
		dcs = dcs[:0]
		for ; i < n && len(dcs) < window; i++ {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent, MessageId: strconv.Itoa(i), ContentType: "application/json", Body: benchBody,
			})
			if err != nil {
				b.Fatal(err)
			}
			dcs = append(dcs, dc)
		}
		for _, dc := range dcs {
			if ok, err := dc.WaitContext(ctx); err != nil || !ok {
				b.Fatalf("raw publish not confirmed: %v", err)
			}
		}
	}
	return time.Since(start)
}

func fillOutbox(b *testing.B, pool *pgxpool.Pool, q string, n int) {
	b.Helper()
	ctx := context.Background()
	for lo := 0; lo < n; lo += 1000 {
		msgs := make([]outbox.Message, 0, 1000)
		for i := lo; i < min(lo+1000, n); i++ {
			msgs = append(msgs, outbox.Message{RoutingKey: q, IdempotencyKey: "bench-" + strconv.Itoa(i), ContentType: "application/json", Body: benchBody})
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.EnqueueBatch(ctx, tx, msgs) }); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRelayThroughput drains b.N pre-enqueued rows through one relay
// (batch of 100, Concurrency 1, 2 and 4) and, in the same run, publishes b.N messages with
// a raw amqp091 confirm loop in windows of 100. It reports both rates and
// their ratio; ns/op is the relay's time per message. Run it with a fixed
// count, e.g. -benchtime=20000x.
func BenchmarkRelayThroughput(b *testing.B) {
	for _, c := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("concurrency=%d", c), func(b *testing.B) { benchThroughput(b, c) })
	}
}

func benchThroughput(b *testing.B, concurrency int) {
	pool, conn, q := benchSetup(b)
	n := b.N
	const batch = 100

	raw := rawConfirmLoop(b, conn, q, n, batch)
	purge(b, conn, q)
	fillOutbox(b, pool, q, n)

	relay, err := New(pool, &Config{
		URL: testenv.AMQPURL(), BatchSize: batch, PollInterval: 50 * time.Millisecond, Concurrency: concurrency,
		Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	if err := relay.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(5 * time.Minute)
	for testutil.ToFloat64(relay.metrics.published) < float64(n) {
		if time.Now().After(deadline) {
			b.Fatal("relay did not drain the outbox")
		}
		<-tick.C
	}
	elapsed := time.Since(start)
	b.StopTimer()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
	defer cancel()
	if err := relay.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	purge(b, conn, q)

	relayRate := float64(n) / elapsed.Seconds()
	rawRate := float64(n) / raw.Seconds()
	b.ReportMetric(relayRate, "relay_msgs/s")
	b.ReportMetric(rawRate, "raw_confirm_msgs/s")
	b.ReportMetric(relayRate/rawRate, "relay/raw")
}

// BenchmarkRelayLag enqueues b.N messages, one per transaction, at a steady
// rate while a relay runs (woken by NOTIFY), and reports the enqueue-to-sent
// lag percentiles measured in the database, per rate and GatherDelay (-1:
// off). Run it with a fixed count, e.g. -benchtime=2000x.
func BenchmarkRelayLag(b *testing.B) {
	for _, rate := range []int{500, 1500} {
		for _, gather := range []time.Duration{-1, time.Millisecond, 10 * time.Millisecond} {
			b.Run(fmt.Sprintf("rate=%d/gather=%s", rate, gather), func(b *testing.B) {
				benchLag(b, rate, gather)
			})
		}
	}
}

func benchLag(b *testing.B, rate int, gather time.Duration) {
	pool, conn, q := benchSetup(b)
	relay, err := New(pool, &Config{
		URL: testenv.AMQPURL(), Registerer: prometheus.NewRegistry(), GatherDelay: gather,
	})
	if err != nil {
		b.Fatal(err)
	}
	var claims atomic.Int64
	relay.hooks.claimed = func(rows int) {
		if rows > 0 {
			claims.Add(1)
		}
	}
	listening := make(chan struct{}, 1)
	relay.hooks.listening = func() { notify(listening) }
	if err := relay.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	testenv.WaitChan(b, listening, "relay LISTEN")

	ctx := context.Background()
	b.ResetTimer()
	// Four enqueuers, each at a quarter of the rate, so that one's
	// transaction does not hold back the others' ticks.
	const enqueuers = 4
	began := time.Now()
	errs := make(chan error, enqueuers)
	for w := range enqueuers {
		go func() {
			tick := time.NewTicker(time.Second * enqueuers / time.Duration(rate))
			defer tick.Stop()
			for i := w; i < b.N; i += enqueuers {
				<-tick.C
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					return outbox.Enqueue(ctx, tx, outbox.Message{RoutingKey: q, IdempotencyKey: "lag-" + strconv.Itoa(i), Body: benchBody})
				})
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range enqueuers {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	achieved := float64(b.N) / time.Since(began).Seconds()
	poll := time.NewTicker(5 * time.Millisecond)
	defer poll.Stop()
	deadline := time.Now().Add(time.Minute)
	for testutil.ToFloat64(relay.metrics.published) < float64(b.N) {
		if time.Now().After(deadline) {
			b.Fatal("relay did not catch up")
		}
		<-poll.C
	}
	b.StopTimer()
	stopCtx, cancel := context.WithTimeout(ctx, testenv.Timeout())
	defer cancel()
	if err := relay.Stop(stopCtx); err != nil {
		b.Fatal(err)
	}
	purge(b, conn, q)

	var p50, p99, maxLag float64
	err = pool.QueryRow(ctx, `SELECT
		percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM sent_at - created_at)),
		percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM sent_at - created_at)),
		max(extract(epoch FROM sent_at - created_at))::float8
		FROM inboxmq_outbox`).Scan(&p50, &p99, &maxLag)
	if err != nil {
		b.Fatal(fmt.Errorf("lag query: %w", err))
	}
	b.ReportMetric(p50*1000, "p50_lag_ms")
	b.ReportMetric(p99*1000, "p99_lag_ms")
	b.ReportMetric(maxLag*1000, "max_lag_ms")
	b.ReportMetric(achieved, "rate_msgs/s")
	b.ReportMetric(float64(b.N)/float64(claims.Load()), "rows/batch")
}
