package producer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/logtest"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/outbox"
	"github.com/inboxmq/inboxmq/producer"
	"github.com/inboxmq/inboxmq/retry"
)

type order struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

func (o order) IdempotencyKey() string { return "order:" + o.ID }

func (o order) Validate() error {
	if o.Amount <= 0 {
		return errors.New("amount must be positive")
	}
	return nil
}

type testBundle struct {
	conn  *amqp.Connection
	queue string
	name  string // the producer's connection_name
}

// setup declares a queue of the test's own and returns a bundle.
func setup(t *testing.T) *testBundle {
	t.Helper()
	b := setupNoQueue(t)
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(b.queue, true, false, false, false, amqp.Table{"x-expires": int32(120_000)})
	require.NoError(t, err)
	require.NoError(t, ch.Close())
	return b
}

// setupNoQueue is setup for a test whose consumer declares the queue.
func setupNoQueue(t *testing.T) *testBundle {
	t.Helper()
	conn := amqptest.Dial(t)
	queue := amqptest.QueueName(t)
	t.Cleanup(func() { amqptest.DeleteQueues(t, conn, queue) })
	return &testBundle{conn: conn, queue: queue, name: "inboxmq-test-producer-" + queue}
}

// producer builds a producer named after the test, closed when it ends.
func (b *testBundle) producer(t *testing.T, cfg *producer.Config) *producer.Producer {
	t.Helper()
	c := producer.Config{URL: testenv.AMQPURL(), ConnectionName: b.name, RetryMinDelay: 10 * time.Millisecond, RetryMaxDelay: 200 * time.Millisecond}
	if cfg != nil {
		c = *cfg
		c.URL = cmpOr(c.URL, testenv.AMQPURL())
		c.ConnectionName = cmpOr(c.ConnectionName, b.name)
	}
	p, err := producer.New(&c)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Publish returns after the confirm: the message is on the queue at once,
// persistent, with the key header and the id the outbox would derive.
func TestPublish_ConfirmedBeforeItReturns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.producer(t, nil)
	before := time.Now().UnixMicro()
	require.NoError(t, producer.Publish(t.Context(), p, "", b.queue, order{ID: "1", Amount: 5}, nil))

	d, ok := amqptest.Get(t, b.conn, b.queue)
	require.True(t, ok, "the message is on the queue when Publish returns")
	require.JSONEq(t, `{"id":"1","amount":5}`, string(d.Body))
	require.Equal(t, "order:1", d.Headers[inboxtype.HeaderIdempotencyKey])
	published, _ := d.Headers[inboxtype.HeaderPublishedAt].(int64)
	require.GreaterOrEqual(t, published, before, "the publication time, in microseconds")
	require.LessOrEqual(t, published, time.Now().UnixMicro())
	require.Equal(t, outbox.DeriveID("", b.queue, "order:1"), d.MessageId, "the outbox's id for the same key")
	require.Equal(t, amqp.Persistent, d.DeliveryMode)
	require.Equal(t, "application/json", d.ContentType)
}

// A message that no queue would get is an error, never dropped in silence.
func TestPublish_UnroutableIsAnError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.producer(t, nil)
	err := producer.Publish(t.Context(), p, "", b.queue+".nobody", order{ID: "1", Amount: 5}, nil)
	require.ErrorIs(t, err, producer.ErrUnroutable)
	var ue *producer.UnroutableError
	require.ErrorAs(t, err, &ue)
	require.Equal(t, uint16(amqp.NoRoute), ue.ReplyCode)
	require.Equal(t, b.queue+".nobody", ue.RoutingKey)

	// Allowed on request: the broker drops it and Publish succeeds.
	require.NoError(t, producer.Publish(t.Context(), p, "", b.queue+".nobody", order{ID: "1", Amount: 5},
		&producer.PublishOpts{AllowUnroutable: true}))
	// The producer is still usable.
	require.NoError(t, producer.Publish(t.Context(), p, "", b.queue, order{ID: "2", Amount: 5}, nil))
	require.Equal(t, 1, amqptest.Depth(t, b.conn, b.queue))
}

// A missing exchange closes the channel with 404: final, not retried for a
// minute.
func TestPublish_MissingExchangeIsNotRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.producer(t, nil)
	start := time.Now()
	err := producer.Publish(t.Context(), p, b.queue+".no-such-exchange", "rk", order{ID: "1", Amount: 5}, nil)
	var ae *amqp.Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, amqp.NotFound, ae.Code)
	require.Less(t, time.Since(start), 5*time.Second)
	require.NoError(t, producer.Publish(t.Context(), p, "", b.queue, order{ID: "2", Amount: 5}, nil), "the next publish gets a new channel")
}

// Invalid input is refused before anything is sent, with a clear error.
func TestPublish_InvalidMessagesAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.producer(t, nil)
	for name, publish := range map[string]func() error{
		"validate": func() error { return producer.Publish(t.Context(), p, "", b.queue, order{ID: "1"}, nil) },
		"no key":   func() error { return producer.Publish(t.Context(), p, "", b.queue, map[string]int{"a": 1}, nil) },
		"bad key":  func() error { return producer.Publish(t.Context(), p, "", b.queue, order{ID: "x\n", Amount: 1}, nil) },
		"encode": func() error {
			return producer.Publish(t.Context(), p, "", b.queue, func() {}, &producer.PublishOpts{Key: "k"})
		},
		"too large": func() error {
			return producer.Publish(t.Context(), p, "", b.queue, order{ID: "1", Amount: 1}, &producer.PublishOpts{Headers: amqp.Table{"pad": strings.Repeat("x", 200_000)}})
		},
	} {
		err := publish()
		require.ErrorIs(t, err, &producer.InvalidError{}, name)
	}
	require.ErrorIs(t, p.Send(t.Context(), &producer.Message{RoutingKey: b.queue, Body: []byte("x")}), producer.ErrNoID)
	require.Zero(t, amqptest.Depth(t, b.conn, b.queue))
}

// The producer's network connection breaks while publishes are in flight:
// every Publish still succeeds (retried on a new connection) and every
// message arrives, some perhaps twice, each with its key's id.
func TestPublish_RetriesAcrossALostConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	logger, rec := logtest.New(slog.LevelDebug)
	p := b.producer(t, &producer.Config{Logger: logger, RetryMinDelay: 10 * time.Millisecond, RetryMaxDelay: 100 * time.Millisecond})
	var (
		mu  sync.Mutex
		ncs []net.Conn
	)
	producer.OnDial(p, func(nc net.Conn) { mu.Lock(); ncs = append(ncs, nc); mu.Unlock() })
	require.NoError(t, producer.Publish(t.Context(), p, "", b.queue, order{ID: "first", Amount: 1}, nil))

	// Four publishers publish 100 messages each; the connection drops
	// under them once they are under way.
	const workers, each = 4, 100
	var (
		wg      sync.WaitGroup
		errs    = make(chan error, workers*each)
		started = make(chan struct{}, workers)
	)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				if i == 20 {
					started <- struct{}{}
				}
				errs <- producer.Publish(t.Context(), p, "", b.queue, order{ID: fmt.Sprintf("%d-%d", w, i), Amount: 1}, nil)
			}
		})
	}
	for range workers {
		testenv.WaitChan(t, started, "publishers under way")
	}
	mu.Lock()
	require.NoError(t, ncs[0].Close(), "the network connection drops")
	mu.Unlock()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err, "every Publish succeeded")
	}
	require.GreaterOrEqual(t, rec.Count("producer connected"), 2, "the producer reconnected")
	require.NotZero(t, rec.Count("producer: publish failed; retrying"), "publishes in flight were retried")

	seen := map[string]int{}
	testenv.WaitFor(t, "every message drained", func() bool {
		for _, d := range amqptest.Drain(t, b.conn, b.queue) {
			key, _ := d.Headers[inboxtype.HeaderIdempotencyKey].(string)
			seen[key]++
			require.Equal(t, outbox.DeriveID("", b.queue, key), d.MessageId)
		}
		return len(seen) == workers*each+1
	})
	require.Contains(t, seen, "order:first")
}

// The broker closes the producer's connection (an operator, a node
// stopping): the next publish reconnects and succeeds.
func TestPublish_ReconnectsAfterTheBrokerClosedTheConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.producer(t, nil)
	require.NoError(t, producer.Publish(t.Context(), p, "", b.queue, order{ID: "1", Amount: 1}, nil))
	amqptest.CloseConnection(t, b.name)
	require.NoError(t, producer.Publish(t.Context(), p, "", b.queue, order{ID: "2", Amount: 1}, nil))
	require.Equal(t, 2, amqptest.Depth(t, b.conn, b.queue))
}

// ctx bounds a publish: a broker that accepts the connection but never
// answers, and a broker that is down, both end with ctx's error, promptly.
func TestPublish_ReturnsPromptlyWhenCtxEnds(t *testing.T) {
	t.Parallel()
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var conns sync.WaitGroup
	defer conns.Wait()
	defer silent.Close()
	conns.Go(func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			conns.Go(func() { // reads, never answers, until the client gives up
				buf := make([]byte, 512)
				for {
					if _, err := c.Read(buf); err != nil {
						_ = c.Close()
						return
					}
				}
			})
		}
	})
	down, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	downAddr := down.Addr().String()
	require.NoError(t, down.Close())

	for name, addr := range map[string]string{"silent": silent.Addr().String(), "down": downAddr} {
		p, err := producer.New(&producer.Config{URL: "amqp://guest:guest@" + addr + "/", DialTimeout: time.Minute, RetryTimeout: -1, RetryMinDelay: 10 * time.Millisecond})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(200*time.Millisecond, cancel)
		start := time.Now()
		err = producer.Publish(ctx, p, "", "q", order{ID: "1", Amount: 1}, nil)
		require.ErrorIs(t, err, context.Canceled, name)
		require.Less(t, time.Since(start), 2*time.Second, name)
		require.NotContains(t, err.Error(), "guest:guest", "no password in errors")
		require.NoError(t, p.Close())
	}
}

// End to end with a consumer and the inbox: two publishes of one key (one
// with another message id) reach the handler once; the key the consumer
// reads is the header's.
func TestPublish_InboxDeduplicatesByKey(t *testing.T) {
	t.Parallel()
	b := setupNoQueue(t)
	pool, _ := pgtest.Schema(t)
	store, err := inbox.NewStore(pool, nil)
	if err == nil {
		err = store.Check(t.Context())
	}
	require.NoError(t, err)
	type seen struct{ key, header, id string }
	calls := make(chan seen, 4)
	outcomes := make(chan inboxtype.Outcome, 4)
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inbox.Handler(store, func(_ context.Context, _ pgx.Tx, m *inboxtype.Message[order]) error {
		h, _ := m.Headers[inboxtype.HeaderIdempotencyKey].(string)
		calls <- seen{m.Key, h, m.ID}
		return nil
	}, nil), &consumer.HandlerOpts{Namespace: "orders", InProcess: retry.InProcess{Tries: -1}})
	c, err := consumer.New(&consumer.Config{URL: testenv.AMQPURL(), Router: r, Observers: []inboxtype.Observer{outcomeObserver(outcomes)}})
	require.NoError(t, err)
	require.NoError(t, c.Start(t.Context()))
	defer func() { require.NoError(t, c.Stop(context.WithoutCancel(t.Context()))) }()

	p := b.producer(t, nil)
	require.NoError(t, producer.Publish(t.Context(), p, "", b.queue, order{ID: "d1", Amount: 7}, nil))
	require.NoError(t, producer.Publish(t.Context(), p, "", b.queue, order{ID: "d1", Amount: 7}, &producer.PublishOpts{MessageID: "another-id"}))

	kinds := map[retry.Kind]int{}
	for range 2 {
		kinds[testenv.WaitChan(t, outcomes, "an outcome").Decision.Kind]++
	}
	require.Equal(t, map[retry.Kind]int{retry.KindSucceeded: 1, retry.KindDuplicate: 1}, kinds)
	got := <-calls
	require.Equal(t, "order:d1", got.key)
	require.Equal(t, "order:d1", got.header)
	// The two deliveries run concurrently: either may claim the key first.
	require.Contains(t, []string{outbox.DeriveID("", b.queue, "order:d1"), "another-id"}, got.id)
	require.Empty(t, calls, "the handler ran once")
}

type outcomeObserver chan inboxtype.Outcome

func (o outcomeObserver) OnTransition(*inboxtype.Delivery, inboxtype.Status, error)           {}
func (o outcomeObserver) OnOutcome(_ *inboxtype.Delivery, out inboxtype.Outcome)              { o <- out }
func (o outcomeObserver) OnInProcessRetry(*inboxtype.Delivery, retry.Decision, time.Duration) {}
func (o outcomeObserver) OnConnState(inboxtype.ConnState, error)                              {}

// Close ends the producer: later publishes fail with ErrClosed.
func TestProducer_Close(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.producer(t, nil)
	require.NoError(t, producer.Publish(t.Context(), p, "", b.queue, order{ID: "1", Amount: 1}, nil))
	require.NoError(t, p.Close())
	require.NoError(t, p.Close())
	require.ErrorIs(t, producer.Publish(t.Context(), p, "", b.queue, order{ID: "2", Amount: 1}, nil), producer.ErrClosed)
}

func TestNew_RefusesABadConfig(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]*producer.Config{
		"nil":      nil,
		"no URL":   {},
		"bad URL":  {URL: "http://x"},
		"bad node": {URL: "amqp://a/, nope://b"},
		"negative": {URL: "amqp://a/", PublishTimeout: -time.Second},
		"retry":    {URL: "amqp://a/", RetryTimeout: -2},
		"delays":   {URL: "amqp://a/", RetryMinDelay: time.Minute, RetryMaxDelay: time.Second},
	} {
		_, err := producer.New(cfg)
		require.Error(t, err, name)
		require.True(t, strings.HasPrefix(err.Error(), "producer: "), name)
	}
	_, err := producer.New(&producer.Config{URL: "amqp://u:secret@a:5672/, amqp://u:secret@b:5672/"})
	require.NoError(t, err, "a comma-separated list of cluster nodes")
}

// With a tracer provider, a publish is one producer span, a child of the
// caller's span, and the message carries the publish span's context, so
// the consumer's span becomes its child.
func TestPublish_ProducerSpanCarriedInTheHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	p := b.producer(t, &producer.Config{TracerProvider: tp})

	ctx, parent := tp.Tracer("test").Start(t.Context(), "checkout")
	require.NoError(t, producer.Publish(ctx, p, "", b.queue, order{ID: "t1", Amount: 1}, nil))
	parent.End()
	err := producer.Publish(ctx, p, "", b.queue+".nobody", order{ID: "t2", Amount: 1}, nil)
	require.ErrorIs(t, err, producer.ErrUnroutable)

	spans := rec.Ended()
	require.Len(t, spans, 3)
	pub := spans[0]
	require.Equal(t, "publish "+b.queue, pub.Name())
	require.Equal(t, trace.SpanKindProducer, pub.SpanKind())
	require.Equal(t, parent.SpanContext().SpanID(), pub.Parent().SpanID())
	require.Equal(t, codes.Error, spans[2].Status().Code, "a failed publish's span says so")

	d, ok := amqptest.Get(t, b.conn, b.queue)
	require.True(t, ok)
	carried := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": d.Headers["traceparent"].(string)})
	require.Equal(t, pub.SpanContext().SpanID(), trace.SpanContextFromContext(carried).SpanID(), "the message carries the publish span")
}
