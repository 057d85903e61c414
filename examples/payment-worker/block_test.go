package main

import (
	"encoding/json"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// The runbook's "block a key at ingress" works on the reference worker: a
// blocked order is parked, not processed, while the others go on; after
// unblock and release it is processed exactly once.
func TestWorkerBlockedKeyIsParkedThenProcessedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.migrate(t)
	ctrl := control.NewStore(b.pool)
	require.NoError(t, ctrl.Block(t.Context(), control.Block{Namespace: b.queue, Pattern: "payment:blk-1", Reason: "incident 42"}))
	t.Cleanup(func() { amqptest.DeleteQueues(t, b.conn, b.queue+".parked") })
	w := b.start(t)

	for _, id := range []string{"blk-1", "blk-2", "blk-1"} {
		body, err := json.Marshal(Payment{OrderID: id, AmountCents: 500, Currency: "EUR"})
		require.NoError(t, err)
		b.pub.Publish(b.queue, body, amqp.Publishing{MessageId: newID()})
	}
	testenv.WaitFor(t, "the unblocked order is paid and both copies of the blocked one are parked", func() bool {
		return b.count(t, `SELECT count(*) FROM payments WHERE order_id = 'blk-2'`) == 1 &&
			amqptest.DepthOrZero(t, b.conn, b.queue+".parked") == 2
	})
	require.Zero(t, b.count(t, `SELECT count(*) FROM payments WHERE order_id = 'blk-1'`), "a blocked key is not processed")

	removed, err := ctrl.Unblock(t.Context(), b.queue, "payment:blk-1", false)
	require.NoError(t, err)
	require.True(t, removed)
	n, err := control.Release(t.Context(), b.conn, b.queue, nil)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	testenv.WaitFor(t, "the released order is paid", func() bool {
		return b.count(t, `SELECT count(*) FROM payments WHERE order_id = 'blk-1'`) == 1 &&
			amqptest.Depth(t, b.conn, b.queue) == 0
	})
	w.stop(t)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM ledger_entries WHERE order_id = 'blk-1'`), "processed once")
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue+".parked"))
}
