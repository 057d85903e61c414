package inboxmq_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/middleware"
	"github.com/inboxmq/inboxmq/internal/redistest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// RouteOpts.Lock: no lock by default, in either mode; the lock in either
// mode when asked. The route's own middleware runs inside the lock, so it
// sees whether the delivery holds it.
func TestWorker_Lock(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		claim  bool
		locked bool
	}{
		{name: "TxDefault"},
		{name: "TxLock", locked: true},
		{name: "ClaimDefault", claim: true},
		{name: "ClaimLock", claim: true, locked: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			rdb := redisFor(t, b.queue)
			results := make(chan string, 1)
			opts := &inboxmq.RouteOpts{
				Middleware: []inboxtype.Middleware{func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
					return func(ctx context.Context, d *inboxtype.Delivery) error {
						results <- d.LockResult
						return next(ctx, d)
					}
				}},
			}
			if tt.locked {
				opts.Lock = &inboxmq.LockOpts{}
			}
			routes := inboxmq.NewRoutes()
			insert := func(ctx context.Context, tx pgx.Tx, id string) error {
				_, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, id)
				return err
			}
			if tt.claim {
				inboxmq.HandleClaim(routes, b.queue, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
					return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error { return insert(ctx, tx, msg.Body.ID) })
				}, opts)
			} else {
				inboxmq.HandleTx(routes, b.queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
					return insert(ctx, tx, msg.Body.ID)
				}, opts)
			}
			w := startWorker(t, b, rdb, routes, prometheus.NewRegistry())
			b.pub.Publish(b.queue, []byte(`{"id":"o1"}`), amqp.Publishing{MessageId: "m1"})
			got := testenv.WaitChan(t, results, "the delivery reaches the route's middleware")
			if tt.locked {
				require.Equal(t, middleware.LockAcquired, got)
			} else {
				require.Empty(t, got, "no lock")
			}
			testenv.WaitFor(t, "the effect", func() bool { return b.count(t, `SELECT count(*) FROM effects`) == 1 })
			require.NoError(t, w.Stop(context.Background()))
		})
	}
}

// A route with the cache and the lock costs two Redis round trips before
// its handler (the cache's read, the obtain) and two after (the release,
// the cache's write); a copy of a completed job costs one and never
// reaches the handler, nor takes the lock.
func TestWorker_CacheAndLockRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rdb := redisFor(t, b.queue)     // for the test's own look-ups
	counted := redisFor(t, b.queue) // the worker's
	trips := &redistest.Trips{}
	counted.AddHook(trips)
	var before atomic.Int64
	calls := make(chan string, 4)
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		before.Store(trips.N.Load())
		_, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, msg.Body.ID)
		calls <- msg.Body.ID
		return err
	}, &inboxmq.RouteOpts{Lock: &inboxmq.LockOpts{}})
	reg := prometheus.NewRegistry()
	startWorker(t, b, counted, routes, reg)

	// The first delivery loads the scripts (NOSCRIPT, then EVAL).
	b.pub.Publish(b.queue, []byte(`{"id":"warm-up"}`), amqp.Publishing{MessageId: "m0"})
	require.Equal(t, "warm-up", testenv.WaitChan(t, calls, "the warm-up delivery"))
	testenv.WaitFor(t, "the warm-up is cached", func() bool { return rdb.Exists(t.Context(), cacheEntry(b.queue, "warm-up")).Val() == 1 })

	start := trips.N.Load()
	b.pub.Publish(b.queue, []byte(`{"id":"o1"}`), amqp.Publishing{MessageId: "m1"})
	require.Equal(t, "o1", testenv.WaitChan(t, calls, "the delivery"))
	require.Equal(t, start+2, before.Load(), "two round trips before the handler")
	testenv.WaitFor(t, "the entry is written", func() bool { return rdb.Exists(t.Context(), cacheEntry(b.queue, "o1")).Val() == 1 })
	require.Equal(t, start+4, trips.N.Load(), "two round trips after it")

	start = trips.N.Load()
	b.pub.Publish(b.queue, []byte(`{"id":"o1"}`), amqp.Publishing{MessageId: "m2"})
	testenv.WaitFor(t, "the copy is acked as a cache duplicate", func() bool {
		return gatherSums(t, reg)[`duplicate_detected_total{source="cache"}`] == 1
	})
	require.Equal(t, start+1, trips.N.Load(), "a cache hit costs one round trip")
	require.Empty(t, calls, "and never reaches the handler")
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM effects`))
}

// cacheEntry is the completed-cache's key of an order of queue's
// namespace.
func cacheEntry(queue, id string) string {
	return fmt.Sprintf("inboxmq:done:%s:order:%s", queue, id)
}

// redisFor returns a Redis client on the test database whose keys of
// namespace (the worker's cache, lock and rate-limit keys name it) are
// deleted when the test ends.
func redisFor(t *testing.T, namespace string) redis.UniversalClient {
	t.Helper()
	rdb, _ := redistest.Client(t)
	t.Cleanup(func() {
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, "*"+namespace+"*", 1000).Iterator()
		for iter.Next(ctx) {
			_ = rdb.Del(ctx, iter.Val()).Err()
		}
	})
	return rdb
}

func startWorker(t *testing.T, b *testBundle, rdb redis.UniversalClient, routes *inboxmq.Routes, reg *prometheus.Registry) *inboxmq.Worker {
	t.Helper()
	w, err := inboxmq.NewWorker(&inboxmq.Config{
		URL: testenv.AMQPURL(), DB: b.pool, Redis: rdb, Routes: routes,
		Registerer: reg,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	require.NoError(t, w.Start(t.Context()))
	return w
}
