package inbox_test

import (
	"encoding/json"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/pgtest"
)

// order is the test payload.
type order struct {
	OrderID string `json:"order_id"`
	Amount  int    `json:"amount"`
}

func (o order) IdempotencyKey() string { return "order:" + o.OrderID }

type testBundle struct {
	pool  *pgxpool.Pool
	store *inbox.Store
}

func setup(t testing.TB, cfg *inbox.StoreConfig) *testBundle {
	t.Helper()
	pool, _ := pgtest.Schema(t)
	return setupOn(t, pool, cfg)
}

// setupOn is setup on a pool of the caller's choosing.
func setupOn(t testing.TB, pool *pgxpool.Pool, cfg *inbox.StoreConfig) *testBundle {
	t.Helper()
	ctx := t.Context()
	_, err := pool.Exec(ctx, `
		CREATE TABLE effects (id bigserial PRIMARY KEY, key text NOT NULL, amount int NOT NULL);
		CREATE TABLE ledger (id bigserial PRIMARY KEY, key text NOT NULL);
		CREATE TABLE orders (order_id text PRIMARY KEY);
		CREATE TABLE parent (id int PRIMARY KEY);
		CREATE TABLE child (id int REFERENCES parent DEFERRABLE INITIALLY DEFERRED);`)
	require.NoError(t, err)
	store, err := inbox.NewStore(pool, cfg)
	if err == nil {
		err = store.Check(ctx)
	}
	require.NoError(t, err)
	return &testBundle{pool: pool, store: store}
}

// tracedPool is a pool of 16 connections on a fresh schema whose
// statements go through tracer.
func tracedPool(t testing.TB, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	_, schema := pgtest.SchemaWith(t, 1)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(schema))
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = tracer
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

var msgSeq atomic.Int64

// newMsg builds a message as the consumer would hand it to a handler.
func newMsg(t testing.TB, namespace string, o order, redelivered bool) *inboxtype.Message[order] {
	t.Helper()
	body, err := json.Marshal(o)
	require.NoError(t, err)
	id := "m-" + strconv.FormatInt(msgSeq.Add(1), 10)
	d := inboxtype.NewDelivery("q", namespace, "w1", &amqp.Delivery{MessageId: id, Body: body, Redelivered: redelivered})
	d.Key = o.IdempotencyKey()
	d.Value = &o
	return &inboxtype.Message[order]{
		ID: id, Key: d.Key, Namespace: namespace, Body: o, Headers: d.Headers,
		Attempt: 1, Redelivered: redelivered, Delivery: d,
	}
}

// orders builds n messages of distinct keys for consumer "payments".
func orders(t *testing.T, n int) []*inboxtype.Message[order] {
	t.Helper()
	msgs := make([]*inboxtype.Message[order], n)
	for i := range msgs {
		msgs[i] = newMsg(t, "payments", order{OrderID: strconv.Itoa(i + 1), Amount: i + 1}, false)
	}
	return msgs
}

func (b *testBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(t.Context(), sql, args...).Scan(&n))
	return n
}

func (b *testBundle) get(t *testing.T, namespace, key string) *inbox.Record {
	t.Helper()
	r, err := b.store.Get(t.Context(), namespace, key)
	require.NoError(t, err)
	return r
}
