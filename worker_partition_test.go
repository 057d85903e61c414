package inboxmq_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/migrations"
)

// A partitioned inbox lives on its retention job, which creates the
// partitions ahead (inserts fail once they run out) and drops the old
// ones. NewWorker cannot know the table is partitioned (it does no I/O):
// Start, which opens the store, refuses to run without Config.Retention,
// before it consumes anything. With it, the same worker runs.
func TestWorker_StartRefusesPartitionedInboxWithoutRetention(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := migrations.PartitionInbox(t.Context(), b.pool, &migrations.PartitionConfig{Width: time.Hour})
	require.NoError(t, err)
	done := make(chan struct{}, 1)
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, msg.Body.ID)
		done <- struct{}{}
		return err
	}, nil)
	newWorker := func(window time.Duration) *inboxmq.Worker {
		w, err := inboxmq.NewWorker(&inboxmq.Config{URL: testenv.AMQPURL(), DB: b.pool, Routes: routes, RetentionWindow: window})
		require.NoError(t, err, "NewWorker does no I/O: it cannot tell")
		return w
	}

	w := newWorker(-1)
	err = w.Start(t.Context())
	require.ErrorContains(t, err, `inbox table "inboxmq_inbox" is partitioned and Config.RetentionWindow is -1`)
	require.ErrorContains(t, err, "retention creates the partitions ahead")
	testenv.WaitChan(t, w.Stopped(), "a refused Start leaves the worker stopped")

	w = newWorker(0)
	require.NoError(t, w.Start(t.Context()))
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	b.pub.Publish(b.queue, []byte(`{"id":"a"}`), amqp.Publishing{MessageId: "a"})
	testenv.WaitChan(t, done, "the delivery is handled")
	testenv.WaitFor(t, "the delivery is acked", func() bool { return amqptest.Depth(t, b.conn, b.queue) == 0 })
	require.NoError(t, w.Stop(t.Context()))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
}
