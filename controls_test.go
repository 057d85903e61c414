package inboxmq_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// consumers is the number of broker consumers on queue.
func (b *testBundle) consumers(t *testing.T, queue string) int {
	t.Helper()
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	return q.Consumers
}

// A worker built from the README's Config alone (no Controls section)
// obeys an operator's pause: its broker consumer goes, a message published
// after the pause waits in the queue unhandled, and resume lets it through.
func TestWorker_ObeysPauseByDefault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	handled := make(chan string, 8)
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if _, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, msg.Body.ID); err != nil {
			return err
		}
		handled <- msg.Body.ID
		return nil
	}, nil)
	w, err := inboxmq.NewWorker(&inboxmq.Config{URL: testenv.AMQPURL(), DB: b.pool, Routes: routes})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	require.NoError(t, w.Start(t.Context()))

	store := control.NewStore(b.pool)
	me := b.presence(t, store)
	require.Equal(t, "live", me.State)
	require.Equal(t, []string{b.queue}, me.Namespaces)
	require.True(t, me.Controls, "controls on by default")
	require.Equal(t, inboxmq.Version, me.Version)
	require.Equal(t, os.Getpid(), me.PID)

	b.pub.Publish(b.queue, []byte(`{"id":"before"}`), amqp.Publishing{})
	require.Equal(t, "before", testenv.WaitChan(t, handled, "the worker consumes"))

	require.NoError(t, store.Pause(t.Context(), b.queue, nil))
	testenv.WaitFor(t, "the paused worker cancels its broker consumer", func() bool { return b.consumers(t, b.queue) == 0 })
	b.pub.Publish(b.queue, []byte(`{"id":"after"}`), amqp.Publishing{})
	require.Equal(t, 1, amqptest.Depth(t, b.conn, b.queue), "the message waits, ready, in the queue")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`), "nothing handled while paused")

	require.NoError(t, store.Resume(t.Context(), b.queue, nil))
	require.Equal(t, "after", testenv.WaitChan(t, handled, "resume lets the waiting message through"))

	require.NoError(t, w.Stop(t.Context()))
	gone := b.presence(t, store)
	require.Equal(t, "stopped", gone.State, "a stopped worker's row is kept, marked stopped")
	require.Equal(t, me.ID, gone.ID)
}

// With the controls disabled the worker ignores a pause, and its
// presence row says so.
func TestWorker_ControlsDisabledIgnoresPause(t *testing.T) {
	t.Parallel()
	b := setup(t)
	handled := make(chan string, 8)
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, func(_ context.Context, _ pgx.Tx, msg *inboxtype.Message[order]) error {
		handled <- msg.Body.ID
		return nil
	}, &inboxmq.RouteOpts{Namespace: "orders"})
	store := control.NewStore(b.pool)
	require.NoError(t, store.Pause(t.Context(), "orders", nil), "paused before the worker starts")
	w, err := inboxmq.NewWorker(&inboxmq.Config{
		URL: testenv.AMQPURL(), DB: b.pool, Routes: routes, Name: "no-controls",
		DisableControls: true,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	require.NoError(t, w.Start(t.Context()))

	me := b.presence(t, store)
	require.Equal(t, "no-controls", me.ID)
	require.Equal(t, "live", me.State)
	require.Equal(t, []string{"orders"}, me.Namespaces)
	require.False(t, me.Controls)

	b.pub.Publish(b.queue, []byte(`{"id":"ignored"}`), amqp.Publishing{})
	require.Equal(t, "ignored", testenv.WaitChan(t, handled, "the pause is not obeyed"))
}

// presence returns the one presence row of the test's schema.
func (b *testBundle) presence(t *testing.T, store *control.Store) control.Presence {
	t.Helper()
	ws, err := store.Workers(t.Context())
	require.NoError(t, err)
	require.Len(t, ws, 1)
	return ws[0]
}
