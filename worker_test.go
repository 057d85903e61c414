package inboxmq_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/outbox"
)

type testBundle struct {
	pool   *pgxpool.Pool
	conn   *amqp.Connection
	pub    *amqptest.Publisher
	queue  string
	events string // exchange the handler's events go to
	sink   string // queue bound to events
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool, _ := pgtest.Schema(t)
	_, err := pool.Exec(t.Context(), `CREATE TABLE effects (id text PRIMARY KEY)`)
	require.NoError(t, err)
	conn := amqptest.Dial(t)
	b := &testBundle{pool: pool, conn: conn, pub: amqptest.NewPublisher(t, conn), queue: amqptest.QueueName(t)}
	b.events, b.sink = b.queue+".events", amqptest.QueueName(t)
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_ = ch.ExchangeDelete(b.events, false, false)
			_ = ch.Close()
		}
	})
	return b
}

func (b *testBundle) count(t *testing.T, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(t.Context(), sql).Scan(&n))
	return n
}

func httpStatus(url string) int {
	resp, err := http.Get(url) //nolint:gosec,noctx // a test's loopback URL
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// A worker with every section on: duplicates of each order have one
// effect and one event, /readyz answers, and Stop lets the delivery in
// flight commit and be acked before it returns: nothing is left in the
// queue or unacknowledged.
func TestWorker_EndToEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rdb := redisFor(t, b.queue)

	var (
		entered = make(chan struct{})
		release = make(chan struct{})
		once    sync.Once
	)
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if msg.Body.ID == "slow" {
			once.Do(func() { close(entered) })
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, msg.Body.ID); err != nil {
			return err
		}
		return outbox.Enqueue(ctx, tx, outbox.Message{Exchange: b.events, RoutingKey: "order.done", IdempotencyKey: msg.Key, Body: []byte(msg.Body.ID)})
	}, &inboxmq.RouteOpts{
		Concurrency: 4,
	})
	reg := prometheus.NewRegistry()
	health := freeAddr(t)
	w, err := inboxmq.NewWorker(&inboxmq.Config{
		URL:        testenv.AMQPURL(),
		DB:         b.pool,
		Redis:      rdb,
		Routes:     routes,
		Registerer: reg,
		Addr:       health,
		Exchanges:  []string{b.events},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	require.NoError(t, w.Start(t.Context()))
	require.Error(t, w.Start(t.Context()), "a worker starts once")

	ch, err := b.conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(b.sink, false, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(b.sink, "#", b.events, false, nil), "Start declared the events exchange")
	require.NoError(t, ch.Close())

	const orders, copies = 10, 3
	for i := range orders {
		for range copies {
			b.pub.Publish(b.queue, fmt.Appendf(nil, `{"id":"o%d"}`, i), amqp.Publishing{MessageId: fmt.Sprintf("m%d", i)})
		}
	}
	testenv.WaitFor(t, "every order has its effect and its event", func() bool {
		return b.count(t, `SELECT count(*) FROM effects`) == orders && amqptest.Depth(t, b.conn, b.sink) == orders
	})
	testenv.WaitFor(t, "every copy is settled", func() bool { return amqptest.Depth(t, b.conn, b.queue) == 0 })
	require.Equal(t, orders, b.count(t, `SELECT count(*) FROM effects`), "one effect per order")
	require.Equal(t, orders, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE status = 'completed'`))

	require.Equal(t, http.StatusOK, httpStatus("http://"+health+"/readyz"), "ready once started")
	mfs, err := reg.Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	require.True(t, names["inboxmq_duplicate_detected_total"], "the worker registered its metrics: %v", names)
	require.True(t, names["inboxmq_outbox_pending"] || len(names) > 10, "and the relay its own: %v", names)

	// A delivery in flight when Stop is called commits and is acked.
	b.pub.Publish(b.queue, []byte(`{"id":"slow"}`), amqp.Publishing{MessageId: "slow"})
	testenv.WaitChan(t, entered, "the slow delivery is being handled")
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(context.Background()) }()
	// While the consumer drains, the listener still answers (it stops
	// last) and /readyz says the worker is not ready.
	testenv.WaitFor(t, "/readyz fails once Stop began", func() bool {
		return httpStatus("http://"+health+"/readyz") == http.StatusServiceUnavailable
	})
	require.Equal(t, http.StatusOK, httpStatus("http://"+health+"/healthz"), "the listener outlives the consumer")
	close(release)
	require.NoError(t, testenv.WaitChan(t, stopped, "Stop returns"))
	testenv.WaitChan(t, w.Stopped(), "Stopped is closed")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE id = 'slow'`), "the in-flight delivery committed")
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue), "and was acked, not requeued")
	require.Equal(t, orders+1, b.count(t, `SELECT count(*) FROM inboxmq_outbox`), "its event committed with it")
	require.Equal(t, 0, httpStatus("http://"+health+"/healthz"), "the health listener is closed")
	require.NoError(t, w.Stop(context.Background()), "Stop twice")
}

// The health listener comes up first, names what Start waits for, and
// goes with everything else when Start fails: a broker that accepts TCP
// and never answers ends Start with a StartTimeoutError after
// ConnectTimeout, and nothing keeps running (goleak checks the rest).
func TestWorker_StartFailureStopsWhatStarted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		for c := range accepted {
			_ = c.Close()
		}
	})
	health := freeAddr(t)
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, noop[order], nil)
	w, err := inboxmq.NewWorker(&inboxmq.Config{
		URL:            "amqp://guest:s3cret@" + ln.Addr().String() + "/",
		DB:             b.pool,
		Routes:         routes,
		ConnectTimeout: 2 * time.Second,
		Addr:           health,
	})
	require.NoError(t, err)

	started := make(chan error, 1)
	go func() { started <- w.Start(t.Context()) }()
	testenv.WaitFor(t, "/readyz is served and not ready while Start waits", func() bool {
		return httpStatus("http://"+health+"/readyz") == http.StatusServiceUnavailable
	})
	err = testenv.WaitChan(t, started, "Start gives up")
	var te *inboxmq.StartTimeoutError
	require.ErrorAs(t, err, &te)
	require.Equal(t, "RabbitMQ", te.Service)
	require.Equal(t, 2*time.Second, te.Timeout)
	require.NotContains(t, err.Error(), "s3cret")
	testenv.WaitChan(t, w.Stopped(), "a failed Start leaves the worker stopped")
	require.Equal(t, 0, httpStatus("http://"+health+"/healthz"), "the health listener is closed")
	require.NoError(t, w.Stop(t.Context()))
	require.Error(t, w.Start(t.Context()), "a stopped worker does not start again")
}

// Run returns after a graceful stop once its context ends.
func TestWorker_RunStopsWhenTheContextEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	done := make(chan struct{})
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, msg.Body.ID)
		close(done)
		return err
	}, nil)
	health := freeAddr(t)
	w, err := inboxmq.NewWorker(&inboxmq.Config{URL: testenv.AMQPURL(), DB: b.pool, Routes: routes, Addr: health})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()
	testenv.WaitFor(t, "the worker is ready", func() bool { return httpStatus("http://"+health+"/readyz") == http.StatusOK })
	b.pub.Publish(b.queue, []byte(`{"id":"a"}`), amqp.Publishing{MessageId: "a"})
	testenv.WaitChan(t, done, "the delivery is handled")
	testenv.WaitFor(t, "the delivery is acked", func() bool { return amqptest.Depth(t, b.conn, b.queue) == 0 })
	cancel()
	err = testenv.WaitChan(t, ran, "Run returns")
	require.NoError(t, err)
	require.False(t, errors.Is(err, context.Canceled))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}
