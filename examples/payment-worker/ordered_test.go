package main

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

func TestConfigOrderedShards(t *testing.T) {
	t.Parallel()
	c, err := loadConfig(map[string]string{})
	require.NoError(t, err)
	require.Zero(t, c.OrderedShards, "off by default")
	c, err = loadConfig(map[string]string{"ORDERED_SHARDS": "6"})
	require.NoError(t, err)
	require.Equal(t, 6, c.OrderedShards)
	for _, bad := range []string{"-1", "x", "2000"} {
		_, err = loadConfig(map[string]string{"ORDERED_SHARDS": bad})
		require.ErrorContains(t, err, "ORDERED_SHARDS", bad)
	}
}

// With ORDERED_SHARDS, two workers consume the payments through shard
// queues, published to the queue's exchange by order id: one effect per
// order, invalid messages dead-lettered, the shards drained.
func TestWorkerOrdered(t *testing.T) {
	t.Parallel()
	amqptest.RequireConsistentHash(t)
	const shards = 3
	b := setup(t, "ORDERED_SHARDS=3")
	amqptest.DeleteOrderedAtCleanup(t, b.conn, b.queue, shards)
	b.migrate(t)
	w1 := b.start(t)
	w2 := b.start(t)

	// Published to the queue's exchange with the order id as routing key:
	// each order 1–3 times, and two invalid messages.
	const orders, invalid = 40, 2
	var msgs []outgoing
	for i := range orders {
		p := &Payment{OrderID: fmt.Sprintf("ord-%05d", i), AmountCents: 100, Currency: "EUR"}
		for range 1 + i%3 {
			msgs = append(msgs, outgoing{payment: p, routingKey: p.OrderID})
		}
	}
	msgs = append(msgs, outgoing{raw: []byte(`{not json`), routingKey: "bad-1"},
		outgoing{raw: []byte(`{"order_id": "ord-bad", "amount_cents": 0, "currency": "EUR"}`), routingKey: "ord-bad"})
	b.publishAll(t, b.queue, msgs)
	testenv.WaitFor(t, "every order paid once and the invalid ones dead-lettered", func() bool {
		return b.count(t, `SELECT count(*) FROM payments WHERE order_id LIKE 'ord-%'`) >= orders &&
			amqptest.DepthOrZero(t, b.conn, b.queue+".dlq") == invalid
	})
	testenv.WaitFor(t, "every copy taken from the shards", func() bool {
		for i := range shards {
			if amqptest.Depth(t, b.conn, consumer.ShardQueueName(b.queue, i)) != 0 {
				return false
			}
		}
		return true
	})
	b.requireOneEffectPerOrder(t, "ord", orders)
	w1.stop(t)
	w2.stop(t)
}
