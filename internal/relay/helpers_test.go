package relay

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/outbox"
)

type testBundle struct {
	pool  *pgxpool.Pool
	conn  *amqp.Connection
	queue string
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool, _ := pgtest.Schema(t)
	conn := amqptest.Dial(t)
	b := &testBundle{pool: pool, conn: conn, queue: declareQueue(t, conn)}
	return b
}

// declareQueue declares a fresh durable queue, deleted when the test ends.
func declareQueue(t *testing.T, conn *amqp.Connection) string {
	t.Helper()
	q := amqptest.QueueName(t)
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-expires": int32(10 * 60 * 1000)})
	require.NoError(t, err)
	return q
}

// newRelay builds a relay with test-friendly timings on its own registry.
func (b *testBundle) newRelay(t *testing.T, cfg *Config) (*Relay, *prometheus.Registry) {
	t.Helper()
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.URL == "" {
		c.URL = testenv.AMQPURL()
	}
	if c.ConnectionName == "" {
		c.ConnectionName = "inboxmq-test " + t.Name()
	}
	if c.PollInterval == 0 {
		c.PollInterval = 50 * time.Millisecond
	}
	if c.ReconnectMinDelay == 0 {
		c.ReconnectMinDelay = 10 * time.Millisecond
		c.ReconnectMaxDelay = 100 * time.Millisecond
	}
	if c.RetryMinDelay == 0 {
		c.RetryMinDelay = 20 * time.Millisecond
		c.RetryMaxDelay = 100 * time.Millisecond
	}
	reg := prometheus.NewRegistry()
	c.Registerer = reg
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	r, err := New(b.pool, &c)
	require.NoError(t, err)
	return r, reg
}

// start runs r in the background until the test ends.
func start(t *testing.T, r *Relay) {
	t.Helper()
	require.NoError(t, r.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
		defer cancel()
		require.NoError(t, r.Stop(ctx))
	})
}

// enqueue commits msgs in one transaction.
func enqueue(t *testing.T, pool *pgxpool.Pool, msgs ...outbox.Message) {
	t.Helper()
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		return outbox.EnqueueBatch(t.Context(), tx, msgs)
	})
	require.NoError(t, err)
}

// msgTo is a message to queue with idempotency key key.
func msgTo(queue, key string) outbox.Message {
	return outbox.Message{RoutingKey: queue, IdempotencyKey: key, ContentType: "text/plain", Body: []byte(key)}
}

func countRows(t *testing.T, pool *pgxpool.Pool, where string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FROM inboxmq_outbox WHERE "+where).Scan(&n))
	return n
}

// waitAllSent waits until the outbox has n rows and none is pending.
func waitAllSent(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	testenv.WaitFor(t, "every outbox row sent", func() bool {
		return countRows(t, pool, "sent_at IS NOT NULL") == n && countRows(t, pool, "sent_at IS NULL") == 0
	})
}

// proxy is a TCP proxy to the test broker that a test can take down, bring
// up and cut, to simulate an unreachable broker and a lost connection.
type proxy struct {
	t       *testing.T
	ln      net.Listener
	target  string
	accepts chan struct{}

	mu    sync.Mutex
	up    bool
	conns []net.Conn
	wg    sync.WaitGroup
}

func newProxy(t *testing.T, up bool) *proxy {
	t.Helper()
	u, err := url.Parse(testenv.AMQPURL())
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{t: t, ln: ln, target: u.Host, up: up, accepts: make(chan struct{}, 1024)}
	p.wg.Go(p.serve)
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

// URL is the AMQP URL through the proxy.
func (p *proxy) URL() string {
	u, _ := url.Parse(testenv.AMQPURL())
	u.Host = p.ln.Addr().String()
	return u.String()
}

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		select {
		case p.accepts <- struct{}{}:
		default:
		}
		p.mu.Lock()
		up := p.up
		p.mu.Unlock()
		if !up {
			_ = c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() { _, _ = io.Copy(s, c); _ = s.Close() })
		p.wg.Go(func() { _, _ = io.Copy(c, s); _ = c.Close() })
	}
}

func (p *proxy) setUp(up bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.up = up
}

// cut closes every proxied connection (the broker "goes away").
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}
