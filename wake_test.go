package inboxmq_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/outboxwire"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/outbox"
)

// A handler's events reach the broker though the worker's relay polls
// only hourly and no NOTIFY is sent for them: the worker wakes its relay
// in-process when the handler returns.
func TestWorker_OutboxWakesItsRelayWithoutNotify(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)

	// A listener of the relays' channel, as another process's relay.
	lconn, err := pgx.ConnectConfig(ctx, b.pool.Config().ConnConfig.Copy())
	require.NoError(t, err)
	t.Cleanup(func() { _ = lconn.Close(context.Background()) })
	var schema string
	require.NoError(t, lconn.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema))
	_, err = lconn.Exec(ctx, `LISTEN `+pgx.Identifier{outboxwire.NotifyChannel}.Sanitize())
	require.NoError(t, err)

	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		return outbox.Enqueue(ctx, tx, outbox.Message{Exchange: b.events, RoutingKey: "order.done", IdempotencyKey: msg.Key, Body: []byte(msg.Body.ID)})
	}, &inboxmq.RouteOpts{Concurrency: 2})
	w, err := inboxmq.NewWorker(&inboxmq.Config{
		URL: testenv.AMQPURL(), DB: b.pool, Routes: routes,
		Exchanges: []string{b.events},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	require.NoError(t, w.Start(ctx))

	ch, err := b.conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(b.sink, false, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(b.sink, "#", b.events, false, nil))
	require.NoError(t, ch.Close())

	const orders = 5
	for i := range orders {
		b.pub.Publish(b.queue, fmt.Appendf(nil, `{"id":"w%d"}`, i), amqp.Publishing{MessageId: fmt.Sprintf("w%d", i)})
	}
	testenv.WaitFor(t, "every order's event published", func() bool { return amqptest.Depth(t, b.conn, b.sink) == orders })

	// No notification about this schema's outbox was sent.
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	for {
		n, err := lconn.WaitForNotification(wctx)
		if err != nil {
			break // the wait ended: nothing (more) came
		}
		require.NotEqual(t, schema, n.Payload, "a NOTIFY for the worker's rows")
	}
}
