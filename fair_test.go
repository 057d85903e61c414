package inboxmq_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

type tenantJob struct {
	Tenant string `json:"tenant"`
	N      int    `json:"n"`
}

func (j tenantJob) IdempotencyKey() string { return j.Tenant + ":" + strconv.Itoa(j.N) }

// A fair route shares a worker's slots among the tenants with messages
// waiting, by weight: while tenant B (weight 3) has messages waiting
// behind tenant A's burst (weight 1), A starts at most one delivery for
// every three of B's, plus the slots A held when B arrived; once B is
// done, A takes every slot again. Every job is applied once.
func TestWorker_FairShares(t *testing.T) {
	t.Parallel()
	amqptest.RequireConsistentHash(t)
	url := amqptest.Vhost(t)
	conn := amqptest.DialURL(t, url)
	pool, _ := pgtest.Schema(t)
	ctx := t.Context()
	_, err := pool.Exec(ctx, `CREATE TABLE tenant_effects (id bigserial PRIMARY KEY, tenant text NOT NULL, n int NOT NULL)`)
	require.NoError(t, err)
	const queue, slots, burstA, burstB = "work", 4, 300, 20

	var (
		mu      sync.Mutex
		shardOf = map[string]string{}
		starts  []string // tenants in start order
		running = map[string]int{}
		maxA    int // most A running at once once B was done
		doneB   int
		a, b    string
		// While gated, A's jobs wait before they start, holding their
		// slots: B's burst then reaches the worker before any slot frees.
		gated   bool
		blocked int
		gate    = make(chan struct{})
	)
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[tenantJob]) error {
		tenant := msg.Body.Tenant
		mu.Lock()
		if gated && tenant == a {
			blocked++
			mu.Unlock()
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
			mu.Lock()
		}
		shardOf[tenant] = msg.Delivery.Raw.ConsumerTag // one per shard subscription
		starts = append(starts, tenant)
		running[tenant]++
		if tenant == a && doneB == burstB {
			maxA = max(maxA, running[tenant])
		}
		mu.Unlock()
		defer func() {
			mu.Lock()
			running[tenant]--
			if tenant == b && b != "" {
				doneB++
			}
			mu.Unlock()
		}()
		select { // the job's work, the same for every tenant
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		_, err := tx.Exec(ctx, `INSERT INTO tenant_effects (tenant, n) VALUES ($1, $2)`, tenant, msg.Body.N)
		return err
	}, &inboxmq.RouteOpts{
		Concurrency: slots,
		Queue:       &inboxmq.QueueOpts{Type: inboxmq.Classic, Prefetch: 64},
		Fair:        &inboxmq.FairOpts{Shards: 4, Weights: map[string]int{"tenant-b": 3, "tenant-b2": 3, "tenant-b3": 3}},
	})
	w, err := inboxmq.NewWorker(&inboxmq.Config{URL: url, DB: pool, Routes: routes, Name: "fair"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	require.NoError(t, w.Start(ctx))

	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	publish := func(tenant string, from, n int) {
		var confirms []*amqp.DeferredConfirmation
		for i := from; i < from+n; i++ {
			body, err := json.Marshal(tenantJob{Tenant: tenant, N: i})
			require.NoError(t, err)
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, queue, tenant, true, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: body,
			})
			require.NoError(t, err)
			confirms = append(confirms, dc)
		}
		for _, dc := range confirms {
			ok, err := dc.WaitContext(ctx)
			require.NoError(t, err)
			require.True(t, ok)
		}
	}
	count := func(tenant string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(DISTINCT n) FROM tenant_effects WHERE tenant = $1`, tenant).Scan(&n))
		return n
	}

	// Tenants that hash to the same shard share its order: pick a B in
	// another shard than A (a probe job each shows the shards).
	candidates := []string{"tenant-a", "tenant-b", "tenant-b2", "tenant-b3"}
	for _, c := range candidates {
		publish(c, 0, 1)
	}
	testenv.WaitFor(t, "the probes", func() bool {
		for _, c := range candidates {
			if count(c) != 1 {
				return false
			}
		}
		return true
	})
	mu.Lock()
	a = "tenant-a"
	for _, c := range candidates[1:] {
		if shardOf[c] != shardOf[a] {
			b = c
			break
		}
	}
	starts = nil
	mu.Unlock()
	require.NotEmpty(t, b, "every candidate hashed to tenant-a's shard: %v", shardOf)

	publish(a, 1, burstA)
	testenv.WaitFor(t, "A's burst running", func() bool { return count(a) > 10 })
	// The bound holds while B has deliveries waiting in the worker: hold
	// every slot with A until B's whole burst has left its shard queue
	// for the worker, so that B's deliveries do not trickle in while A's
	// run (which the route allows: it is work-conserving).
	mu.Lock()
	gated = true
	bShard := strings.Split(shardOf[b], "/")[1] // the tag is "<worker>/<queue>/<n>"
	mu.Unlock()
	testenv.WaitFor(t, "every slot held by A", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return blocked == slots
	})
	publish(b, 1, burstB)
	testenv.WaitFor(t, "B's burst handed to the worker", func() bool { return amqptest.Depth(t, conn, bShard) == 0 })
	mu.Lock()
	gated = false
	close(gate)
	mu.Unlock()
	testenv.WaitFor(t, "every job applied", func() bool { return count(a) == burstA+1 && count(b) == burstB+1 })

	mu.Lock()
	defer mu.Unlock()
	first, last := -1, -1
	for i, tenant := range starts {
		if tenant == b {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	aDuring := 0
	for _, tenant := range starts[first:last] {
		if tenant == a {
			aDuring++
		}
	}
	bound := (burstB-1+2)/3 + slots // one A for every three B, and the slots A held
	t.Logf("A started %d deliveries while B's %d ran (bound %d); A ran %d at once after B", aDuring, burstB, bound, maxA)
	require.LessOrEqual(t, aDuring, bound, "A took more than its share while B waited")
	require.Equal(t, slots, maxA, "A alone did not get every slot back")
	var total int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM tenant_effects`).Scan(&total))
	require.Equal(t, burstA+burstB+len(candidates), total, "a job applied twice")
}

// A fair route's worker stopped mid-burst returns the deliveries waiting
// in it to their shards: nothing is lost, and the next worker applies the
// rest, each once.
func TestWorker_FairStopMidBurst(t *testing.T) {
	t.Parallel()
	amqptest.RequireConsistentHash(t)
	url := amqptest.Vhost(t)
	conn := amqptest.DialURL(t, url)
	pool, _ := pgtest.Schema(t)
	ctx := t.Context()
	_, err := pool.Exec(ctx, `CREATE TABLE tenant_effects (id bigserial PRIMARY KEY, tenant text NOT NULL, n int NOT NULL)`)
	require.NoError(t, err)
	const queue, n, shards, before = "work", 200, 2, 20
	// The jobs after the first `before` wait at the gate (held says so)
	// until the worker stopped consuming: the stop comes mid-burst however
	// fast the machine runs the first ones.
	var started atomic.Int64
	held, gate := make(chan struct{}, 2), make(chan struct{})
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[tenantJob]) error {
		if started.Add(1) > before {
			select {
			case held <- struct{}{}:
			default:
			}
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO tenant_effects (tenant, n) VALUES ($1, $2)`, msg.Body.Tenant, msg.Body.N)
		return err
	}, &inboxmq.RouteOpts{
		Concurrency: 2,
		Queue:       &inboxmq.QueueOpts{Type: inboxmq.Classic, Prefetch: 32},
		Fair:        &inboxmq.FairOpts{Shards: shards},
	})
	start := func() *inboxmq.Worker {
		w, err := inboxmq.NewWorker(&inboxmq.Config{URL: url, DB: pool, Routes: routes, Name: "fair"})
		require.NoError(t, err)
		t.Cleanup(func() { _ = w.Stop(context.Background()) })
		require.NoError(t, w.Start(ctx))
		return w
	}
	applied := func() int {
		var c int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM tenant_effects`).Scan(&c))
		return c
	}
	w := start()
	p := amqptest.NewPublisher(t, conn)
	for i := range n {
		tenant := "tenant-" + strconv.Itoa(i%5)
		body, err := json.Marshal(tenantJob{Tenant: tenant, N: i})
		require.NoError(t, err)
		p.PublishTo(queue, tenant, body, amqp.Publishing{ContentType: "application/json"})
	}
	testenv.WaitChan(t, held, "a job held at the gate")
	testenv.WaitChan(t, held, "both slots held at the gate")
	shardConsumers := func() int {
		ch, err := conn.Channel()
		require.NoError(t, err)
		defer ch.Close()
		c := 0
		for i := range shards {
			q, err := ch.QueueDeclarePassive(queue+".shard."+strconv.Itoa(i), true, false, false, false, nil)
			require.NoError(t, err)
			c += q.Consumers
		}
		return c
	}
	stopCtx, cancel := context.WithTimeout(ctx, testenv.Timeout())
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(stopCtx) }()
	testenv.WaitFor(t, "the worker stopped consuming its shards", func() bool { return shardConsumers() == 0 })
	close(gate) // the two held jobs finish; the rest waits in the worker
	require.NoError(t, testenv.WaitChan(t, stopped, "the stop"))
	queued := func() int {
		q := 0
		for i := range shards {
			q += amqptest.Depth(t, conn, queue+".shard."+strconv.Itoa(i))
		}
		return q
	}
	// The broker puts the returned deliveries back as the channels close.
	testenv.WaitFor(t, "every job applied or back in its shard", func() bool { return applied()+queued() == n })
	require.Positive(t, queued(), "the stop came after the burst")

	start()
	testenv.WaitFor(t, "the rest applied", func() bool { return applied() >= n })
	var distinct int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(DISTINCT n) FROM tenant_effects`).Scan(&distinct))
	require.Equal(t, n, distinct)
	require.Equal(t, n, applied(), "a job applied twice")
}
