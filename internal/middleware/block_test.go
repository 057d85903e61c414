package middleware_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/controlrun"
	"github.com/inboxmq/inboxmq/internal/middleware"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/migrations"
	"github.com/inboxmq/inboxmq/retry"
)

type blockOrder struct {
	ID string `json:"id"`
}

func (o blockOrder) IdempotencyKey() string { return "order:" + o.ID }

type blockBundle struct {
	conn    *amqp.Connection
	queue   string
	store   *control.Store
	watcher *controlrun.Watcher
	handler inboxtype.DeliveryHandler
	pub     *amqptest.Publisher

	mu      sync.Mutex
	handled map[string]int
}

func setupBlock(t *testing.T, parker middleware.Parker) *blockBundle {
	t.Helper()
	pool, _ := pgtest.Schema(t)
	conn := amqptest.Dial(t)
	queue := amqptest.QueueName(t)
	t.Cleanup(func() {
		ch, err := conn.Channel()
		if err == nil {
			_, _ = ch.QueueDelete(inboxtype.ParkedQueue(queue), false, false, false)
			_ = ch.Close()
		}
	})
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(queue, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.Close())

	// Poll only, and rarely: the tests refresh the snapshot explicitly.
	w, err := controlrun.NewWatcher(pool, &controlrun.WatcherConfig{NoListen: true, PollInterval: time.Hour})
	require.NoError(t, err)
	if parker == nil {
		p := controlrun.NewParker(conn)
		t.Cleanup(func() { _ = p.Close() })
		parker = p
	}
	mw, err := middleware.Block(w, parker, nil)
	require.NoError(t, err)

	b := &blockBundle{conn: conn, queue: queue, store: control.NewStore(pool), watcher: w, pub: amqptest.NewPublisher(t, conn), handled: map[string]int{}}
	r := consumer.NewRouter()
	consumer.Register(r, queue, inboxtype.HandlerFunc[blockOrder](func(_ context.Context, m *inboxtype.Message[blockOrder]) error {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.handled[m.Key]++
		return nil
	}), &consumer.HandlerOpts{Middleware: []inboxtype.Middleware{mw}})
	b.handler = r.Routes()[0].Handler
	return b
}

func (b *blockBundle) publish(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		b.pub.Publish(b.queue, fmt.Appendf(nil, `{"id":%q}`, id), amqp.Publishing{MessageId: "m-" + id})
	}
}

// drive plays the consumer's part for every message in the queue: run the
// chain, ack on success or duplicate (never before the chain returns), and
// return the decisions.
func (b *blockBundle) drive(t *testing.T) []retry.Decision {
	t.Helper()
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	var out []retry.Decision
	for {
		raw, ok, err := ch.Get(b.queue, false)
		require.NoError(t, err)
		if !ok {
			return out
		}
		d := inboxtype.NewDelivery(b.queue, b.queue, "test", &raw)
		dec := retry.Classify(b.handler(t.Context(), d))
		out = append(out, dec)
		if dec.Kind == retry.KindSucceeded || dec.Kind == retry.KindDuplicate {
			require.NoError(t, raw.Ack(false))
		} else {
			require.NoError(t, raw.Nack(false, true))
			return out
		}
	}
}

func TestBlock_ParksBlockedKeyAndReleasesOnUnblock(t *testing.T) {
	t.Parallel()
	b := setupBlock(t, nil)
	ctx := t.Context()
	require.NoError(t, b.store.Block(ctx, control.Block{Namespace: b.queue, Pattern: "order:2", Reason: "fraud check"}))
	require.NoError(t, b.watcher.Refresh(ctx))

	b.publish(t, "1", "2", "3")
	decs := b.drive(t)
	require.Len(t, decs, 3)
	require.Equal(t, retry.KindDuplicate, decs[1].Kind)
	require.Equal(t, retry.SourceParked, decs[1].Source)
	require.Equal(t, map[string]int{"order:1": 1, "order:3": 1}, b.handled)
	require.Zero(t, amqptest.Depth(t, b.conn, b.queue))
	require.Equal(t, 1, amqptest.Depth(t, b.conn, inboxtype.ParkedQueue(b.queue)))

	// inboxctl unblock: remove the block, then release the parked messages.
	removed, err := b.store.Unblock(ctx, b.queue, "order:2", false)
	require.NoError(t, err)
	require.True(t, removed)
	n, err := control.Release(ctx, b.conn, b.queue, &control.ReleaseOpts{Key: "order:2"})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Zero(t, amqptest.Depth(t, b.conn, inboxtype.ParkedQueue(b.queue)))

	// The snapshot still says blocked (no refresh): the database re-check
	// lets the released delivery through, and it is processed once.
	require.True(t, b.watcher.Blocked(b.queue, "order:2"))
	decs = b.drive(t)
	require.Len(t, decs, 1)
	require.Equal(t, retry.KindSucceeded, decs[0].Kind)
	require.Equal(t, map[string]int{"order:1": 1, "order:2": 1, "order:3": 1}, b.handled)
	require.Zero(t, amqptest.Depth(t, b.conn, b.queue))
}

func TestBlock_PrefixAndParkedHeaders(t *testing.T) {
	t.Parallel()
	b := setupBlock(t, nil)
	ctx := t.Context()
	require.NoError(t, b.store.Block(ctx, control.Block{Namespace: b.queue, Pattern: "order:9", Prefix: true}))
	require.NoError(t, b.watcher.Refresh(ctx))

	b.publish(t, "91", "92", "1")
	b.drive(t)
	require.Equal(t, map[string]int{"order:1": 1}, b.handled)

	parked := amqptest.Drain(t, b.conn, inboxtype.ParkedQueue(b.queue))
	require.Len(t, parked, 2)
	require.Equal(t, "order:91", parked[0].Headers[inboxtype.HeaderIdempotencyKey])
	require.Equal(t, "blocked", parked[0].Headers[inboxtype.HeaderParkedReason])
	require.Equal(t, "order:9", parked[0].Headers[inboxtype.HeaderParkedPattern])
	require.Equal(t, b.queue, parked[0].Headers[inboxtype.HeaderOriginalQueue])
	require.Equal(t, "m-91", parked[0].MessageId)
	require.JSONEq(t, `{"id":"91"}`, string(parked[0].Body))
}

// Release moves only the matching messages and keeps the others parked.
func TestRelease_SelectsByKey(t *testing.T) {
	t.Parallel()
	b := setupBlock(t, nil)
	ctx := t.Context()
	require.NoError(t, b.store.Block(ctx, control.Block{Namespace: b.queue, Pattern: "order:", Prefix: true}))
	require.NoError(t, b.watcher.Refresh(ctx))
	b.publish(t, "1", "2", "3")
	b.drive(t)
	require.Empty(t, b.handled)

	n, err := control.Release(ctx, b.conn, b.queue, &control.ReleaseOpts{Key: "order:2"})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 2, amqptest.Depth(t, b.conn, inboxtype.ParkedQueue(b.queue)))
	require.Equal(t, 1, amqptest.Depth(t, b.conn, b.queue))

	n, err = control.Release(ctx, b.conn, b.queue, nil)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, 3, amqptest.Depth(t, b.conn, b.queue))
}

type failingParker struct{}

func (failingParker) Park(context.Context, *inboxtype.Delivery, control.Block) error {
	return errors.New("broker unreachable")
}

// A park that fails is retried: the handler does not run and nothing is
// acked.
func TestBlock_ParkFailureIsRetryable(t *testing.T) {
	t.Parallel()
	b := setupBlock(t, failingParker{})
	ctx := t.Context()
	require.NoError(t, b.store.Block(ctx, control.Block{Namespace: b.queue, Pattern: "order:1"}))
	require.NoError(t, b.watcher.Refresh(ctx))
	b.publish(t, "1")
	decs := b.drive(t)
	require.Len(t, decs, 1)
	require.Equal(t, retry.KindRetry, decs[0].Kind)
	require.Equal(t, "park", decs[0].Reason)
	require.Empty(t, b.handled)
	require.Equal(t, 1, amqptest.Depth(t, b.conn, b.queue), "not acked")
}

func TestBlock_InvalidArguments(t *testing.T) {
	t.Parallel()
	_, err := middleware.Block(nil, failingParker{}, nil)
	require.Error(t, err)
	pool, _ := pgtest.Schema(t)
	w, err := controlrun.NewWatcher(pool, nil)
	require.NoError(t, err)
	_, err = middleware.Block(w, nil, nil)
	require.Error(t, err)
}

// printParker stands in for *controlrun.Parker (which publishes to
// "<queue>.parked" with confirms).
type printParker struct{}

func (printParker) Park(_ context.Context, d *inboxtype.Delivery, b control.Block) error {
	fmt.Printf("parked %s in %s (%s)\n", d.Key, inboxtype.ParkedQueue(d.Queue), b.Reason)
	return nil
}

// Block goes into the handler's middleware, after decoding, where the
// idempotency key is known.
func ExampleBlock() {
	ctx := context.Background()
	pool, drop := blockExampleDB(ctx)
	defer drop()

	w, _ := controlrun.NewWatcher(pool, nil)
	_ = control.NewStore(pool).Block(ctx, control.Block{Namespace: "orders", Pattern: "order:2", Reason: "fraud check"})
	if err := w.Start(ctx); err != nil {
		panic(err)
	}
	defer w.Stop(ctx)

	block, err := middleware.Block(w, printParker{}, nil)
	if err != nil {
		panic(err)
	}
	r := consumer.NewRouter()
	consumer.Register(r, "orders", inboxtype.HandlerFunc[blockOrder](func(_ context.Context, m *inboxtype.Message[blockOrder]) error {
		fmt.Println("handled", m.Key)
		return nil
	}), &consumer.HandlerOpts{Middleware: []inboxtype.Middleware{block}})
	h := r.Routes()[0].Handler

	for _, id := range []string{"1", "2"} {
		raw := &amqp.Delivery{Body: fmt.Appendf(nil, `{"id":%q}`, id)}
		err := h(ctx, inboxtype.NewDelivery("orders", "orders", "worker-1", raw))
		fmt.Println(retry.Classify(err).Kind) // the consumer acks both
	}
	// Output:
	// handled order:1
	// succeeded
	// parked order:2 in orders.parked (fraud check)
	// duplicate
}

// blockExampleDB opens a pool on a fresh, migrated schema and returns a function
// that drops it.
func blockExampleDB(ctx context.Context) (*pgxpool.Pool, func()) {
	schema := "ex_" + strings.ToLower(rand.Text()[:12])
	admin, err := pgx.Connect(ctx, testenv.DatabaseURL())
	if err != nil {
		panic(err)
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		panic(err)
	}
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL())
	if err != nil {
		panic(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	if err := migrations.Up(ctx, pool); err != nil {
		panic(err)
	}
	return pool, func() {
		pool.Close()
		_, _ = admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		_ = admin.Close(context.Background())
	}
}
