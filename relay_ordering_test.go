package inboxmq_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/outbox"
)

// The worker's relay, as configured by default, publishes the rows of an
// ordering key one at a time: the head of key A cannot be routed (its
// queue does not exist yet) and backs off, and A's later row waits for it
// while key B's row goes out; once the queue exists, A's rows go out in
// enqueue order.
func TestWorker_RelayHoldsAnOrderingKeyBehindItsHead(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	missing := amqptest.QueueName(t) // declared later
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(b.sink, false, false, false, false, amqp.Table{"x-expires": int32(10 * 60 * 1000)})
	require.NoError(t, err)
	require.NoError(t, ch.Close())

	a1 := outbox.Message{RoutingKey: missing, IdempotencyKey: "a1", OrderingKey: "A", Body: []byte("a1")}
	a2 := outbox.Message{RoutingKey: b.sink, IdempotencyKey: "a2", OrderingKey: "A", Body: []byte("a2")}
	b1 := outbox.Message{RoutingKey: b.sink, IdempotencyKey: "b1", OrderingKey: "B", Body: []byte("b1")}
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		return outbox.EnqueueBatch(ctx, tx, []outbox.Message{a1, a2, b1})
	}))

	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, func(context.Context, pgx.Tx, *inboxtype.Message[order]) error { return nil }, nil)
	w, err := inboxmq.NewWorker(&inboxmq.Config{URL: testenv.AMQPURL(), DB: b.pool, Routes: routes})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	require.NoError(t, w.Start(ctx))

	testenv.WaitFor(t, "a1 returned twice, b1 sent", func() bool {
		return b.count(t, `SELECT count(*) FROM inboxmq_outbox WHERE idempotency_key = 'a1' AND attempts >= 2 AND last_error LIKE 'unroutable%'`) == 1 &&
			b.count(t, `SELECT count(*) FROM inboxmq_outbox WHERE idempotency_key = 'b1' AND sent_at IS NOT NULL`) == 1
	})
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM inboxmq_outbox WHERE idempotency_key = 'a2' AND sent_at IS NOT NULL`),
		"a2 waits for a1, the head of its ordering key")

	ch, err = b.conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(missing, false, false, false, false, amqp.Table{"x-expires": int32(10 * 60 * 1000)})
	require.NoError(t, err)
	require.NoError(t, ch.Close())
	testenv.WaitFor(t, "every row sent", func() bool {
		return b.count(t, `SELECT count(*) FROM inboxmq_outbox WHERE sent_at IS NULL`) == 0
	})
	var a1At, a2At time.Time
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT
		(SELECT sent_at FROM inboxmq_outbox WHERE idempotency_key = 'a1'),
		(SELECT sent_at FROM inboxmq_outbox WHERE idempotency_key = 'a2')`).Scan(&a1At, &a2At))
	require.True(t, a1At.Before(a2At), "a1 sent at %s, a2 at %s", a1At, a2At)
	require.Len(t, amqptest.Drain(t, b.conn, missing), 1)
	require.Len(t, amqptest.Drain(t, b.conn, b.sink), 2)
}

// A service that only enqueues runs a worker without routes: it consumes
// nothing, serves its health, and its relay publishes what the service's
// own transactions enqueued; Stop ends it.
func TestWorker_WithoutRoutesRunsTheRelay(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(b.sink, false, false, false, false, amqp.Table{"x-expires": int32(10 * 60 * 1000)})
	require.NoError(t, err)
	require.NoError(t, ch.Close())

	addr := freeAddr(t)
	w, err := inboxmq.NewWorker(&inboxmq.Config{URL: testenv.AMQPURL(), DB: b.pool, Addr: addr})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	require.NoError(t, w.Start(ctx))
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		return outbox.Enqueue(ctx, tx, outbox.Message{RoutingKey: b.sink, IdempotencyKey: "signup:42", Body: []byte("welcome")})
	}))
	testenv.WaitFor(t, "the row relayed", func() bool { return amqptest.Depth(t, b.conn, b.sink) == 1 })
	msgs := amqptest.Drain(t, b.conn, b.sink)
	require.Len(t, msgs, 1)
	require.Equal(t, "welcome", string(msgs[0].Body))
	require.Equal(t, http.StatusOK, httpStatus("http://"+addr+"/readyz"))
	require.Equal(t, http.StatusOK, httpStatus("http://"+addr+"/healthz"))

	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, w.Stop(stopCtx))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM inboxmq_outbox WHERE sent_at IS NULL`))
}
