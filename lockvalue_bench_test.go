package inboxmq_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/redistest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// benchPayment is the payload of BenchmarkLockValue: a payment keyed by
// its order.
type benchPayment struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

func (p benchPayment) IdempotencyKey() string { return "payment:" + p.OrderID }

// BenchmarkLockValue asks whether the Redis lock earns its round trips,
// in transactional mode, where the inbox's unique index already makes a
// copy wait for the first's commit, and in claim mode, where the first's
// live claim already turns a copy away before its outside call. One worker
// (8 handlers, the payment-worker's 1s RetryDelay) drains bursts of
// burstDeliveries deliveries per iteration, with and without the lock and
// the completed-cache, from two streams:
//
//   - unique: every key once;
//   - dups: every key copiesPerKey times, the copies published one after
//     the other (different message ids), so they are handled at once.
//
// The transactional route (tx) inserts a payment and its ledger entry; the
// claim route (claim) makes an outside call of outsideCall first, then
// completes its claim with the same two inserts.
//
// It reports deliveries/s (first publish to last ack), the PostgreSQL
// connections acquired per delivery, busy on average (sampled every
// millisecond) and the connection time per delivery, the copies that spent
// a transaction or a claim statement to learn they were duplicates
// (inbox-dups/op), those the cache acked (cache-dups/op), those deferred
// through the broker by the lock or by a live claim (deferrals/op), and the
// outside calls per key (claim mode; it must be 1). The figures are
// discussed in docs/performance.md.
func BenchmarkLockValue(b *testing.B) {
	const copiesPerKey = 4
	for _, route := range []string{"tx", "claim"} {
		for _, stream := range []struct {
			name   string
			copies int
		}{{"unique", 1}, {"dups", copiesPerKey}} {
			for _, mode := range []struct {
				name  string
				lock  bool
				redis bool
			}{
				{"lock+cache", true, true},
				{"cache", false, true},
				{"none", false, false},
			} {
				b.Run(route+"/"+stream.name+"/"+mode.name, func(b *testing.B) {
					benchLockValue(b, route == "claim", stream.copies, mode.lock, mode.redis)
				})
			}
		}
	}
}

const (
	burstDeliveries = 1000
	// outsideCall is how long the claim route's outside call takes: a fast
	// payment gateway.
	outsideCall = 5 * time.Millisecond
)

func benchLockValue(b *testing.B, claim bool, copies int, lock, withRedis bool) {
	ctx := b.Context()
	pool, _ := pgtest.SchemaWith(b, 16)
	_, err := pool.Exec(ctx, `
		CREATE TABLE payments (order_id text PRIMARY KEY, amount_cents bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
		CREATE TABLE ledger_entries (id bigserial PRIMARY KEY, order_id text NOT NULL, amount_cents bigint NOT NULL)`)
	require.NoError(b, err)
	conn := amqptest.Dial(b)
	queue := amqptest.QueueName(b)
	var rdb redis.UniversalClient // the cache, and the lock of lock+cache
	if withRedis {
		rdb, _ = redistest.Client(b)
	}

	write := func(ctx context.Context, tx pgx.Tx, p benchPayment) error {
		if _, err := tx.Exec(ctx, `INSERT INTO payments (order_id, amount_cents) VALUES ($1, $2)`, p.OrderID, p.AmountCents); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO ledger_entries (order_id, amount_cents) VALUES ($1, $2)`, p.OrderID, p.AmountCents)
		return err
	}
	opts := &inboxmq.RouteOpts{Concurrency: 8}
	if lock {
		opts.Lock = &inboxmq.LockOpts{RetryDelay: time.Second}
	}
	routes := inboxmq.NewRoutes()
	var calls sync.Map // order id → *atomic.Int64: the claim route's outside calls
	if claim {
		inboxmq.HandleClaim(routes, queue, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[benchPayment]) error {
			n, _ := calls.LoadOrStore(msg.Body.OrderID, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			select { // the outside call, with c.Key as its Idempotency-Key
			case <-time.After(outsideCall):
			case <-ctx.Done():
				return ctx.Err()
			}
			return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error { return write(ctx, tx, msg.Body) })
		}, opts)
	} else {
		inboxmq.HandleTx(routes, queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[benchPayment]) error {
			return write(ctx, tx, msg.Body)
		}, opts)
	}
	reg := prometheus.NewRegistry()
	w, err := inboxmq.NewWorker(&inboxmq.Config{
		URL: testenv.AMQPURL(), DB: pool, Redis: rdb, Routes: routes,
		Registerer: reg,
		// Off: the watcher's LISTEN connection and polls would count in
		// the pool figures this benchmark reports.
		DisableControls: true,
	})
	require.NoError(b, err)
	b.Cleanup(func() { _ = w.Stop(context.Background()) })
	require.NoError(b, w.Start(ctx))

	ch, err := conn.Channel()
	require.NoError(b, err)
	require.NoError(b, ch.Confirm(false))
	b.Cleanup(func() { _ = ch.Close() })

	var (
		elapsed                         time.Duration
		acquires, connMillis            float64
		inboxDups, cacheDups, deferrals float64
	)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		bodies := make([][]byte, 0, burstDeliveries)
		for k := 0; len(bodies) < burstDeliveries; k++ {
			body := fmt.Appendf(nil, `{"order_id":"b%d-%05d","amount_cents":%d}`, i, k, 100+k)
			for range copies {
				bodies = append(bodies, body)
			}
		}
		before := gatherSums(b, reg)
		acq0 := pool.Stat().AcquireCount()
		b.StartTimer()

		start := time.Now()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var busy, n float64
		wg.Go(func() {
			t := time.NewTicker(time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					busy += float64(pool.Stat().AcquiredConns())
					n++
				}
			}
		})
		publishBurst(b, ch, queue, bodies)
		testenv.WaitFor(b, "every delivery of the burst is acked", func() bool {
			return gatherSums(b, reg)[`deliveries_settled_total{action="acked"}`]-before[`deliveries_settled_total{action="acked"}`] >= float64(len(bodies))
		})
		took := time.Since(start)
		elapsed += took
		close(stop)
		wg.Wait()

		b.StopTimer()
		after := gatherSums(b, reg)
		acquires += float64(pool.Stat().AcquireCount() - acq0)
		connMillis += busy / max(n, 1) * float64(took.Microseconds()) / 1000
		inboxDups += after[`duplicate_detected_total{source="inbox"}`] - before[`duplicate_detected_total{source="inbox"}`]
		cacheDups += after[`duplicate_detected_total{source="cache"}`] - before[`duplicate_detected_total{source="cache"}`]
		for _, reason := range []string{"lock_unavailable", "claim_held"} {
			k := fmt.Sprintf("job_retry_total{reason=%q}", reason)
			deferrals += after[k] - before[k]
		}
		requireOnePaymentPerKey(b, pool, fmt.Sprintf("b%d-", i), burstDeliveries/copies)
		b.StartTimer()
	}
	b.StopTimer()
	deliveries := float64(b.N * burstDeliveries)
	b.ReportMetric(deliveries/elapsed.Seconds(), "deliveries/s")
	b.ReportMetric(acquires/deliveries, "pg-acquires/delivery")
	b.ReportMetric(connMillis/float64(elapsed.Milliseconds()), "pg-busy-conns")
	b.ReportMetric(connMillis/deliveries, "pg-conn-ms/delivery")
	b.ReportMetric(inboxDups/float64(b.N), "inbox-dups/op")
	b.ReportMetric(cacheDups/float64(b.N), "cache-dups/op")
	b.ReportMetric(deferrals/float64(b.N), "deferrals/op")
	if claim {
		var keys, total int64
		calls.Range(func(_, n any) bool {
			keys++
			total += n.(*atomic.Int64).Load()
			return true
		})
		require.Equal(b, int64(b.N*burstDeliveries/copies), keys, "an outside call for every key")
		b.ReportMetric(float64(total)/float64(keys), "outside-calls/key")
	}
	b.ReportMetric(0, "ns/op")
	require.NoError(b, w.Stop(context.Background()))
}

// publishBurst publishes bodies to queue in order, each under its own
// message id, and waits for every confirm.
func publishBurst(tb testing.TB, ch *amqp.Channel, queue string, bodies [][]byte) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
	defer cancel()
	confirms := make([]*amqp.DeferredConfirmation, len(bodies))
	for i, body := range bodies {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
			MessageId: fmt.Sprintf("%s-%d-%d", queue, time.Now().UnixNano(), i), ContentType: "application/json",
			DeliveryMode: amqp.Persistent, Body: body,
		})
		require.NoError(tb, err)
		confirms[i] = dc
	}
	for _, dc := range confirms {
		ok, err := dc.WaitContext(ctx)
		require.NoError(tb, err)
		require.True(tb, ok, "publish confirmed")
	}
}

// gatherSums returns the worker's counters summed over every label but
// the one kept: name{label="value"} (name without the namespace).
func gatherSums(tb testing.TB, reg *prometheus.Registry) map[string]float64 {
	tb.Helper()
	mfs, err := reg.Gather()
	require.NoError(tb, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		name := strings.TrimPrefix(mf.GetName(), "inboxmq_")
		for _, m := range mf.GetMetric() {
			if m.GetCounter() == nil {
				continue
			}
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "action", "source", "reason":
					out[fmt.Sprintf("%s{%s=%q}", name, l.GetName(), l.GetValue())] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// requireOnePaymentPerKey checks the burst's effects: one payment and one
// ledger entry per key.
func requireOnePaymentPerKey(tb testing.TB, pool *pgxpool.Pool, prefix string, keys int) {
	tb.Helper()
	var payments, ledger int
	require.NoError(tb, pool.QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM payments WHERE order_id LIKE $1), (SELECT count(*) FROM ledger_entries WHERE order_id LIKE $1)`,
		prefix+"%").Scan(&payments, &ledger))
	require.Equal(tb, keys, payments, "one payment per key")
	require.Equal(tb, keys, ledger, "one ledger entry per key")
}
