package relay

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/outbox"
)

// Rows enqueued for an ordered route (Exchange: its consistent-hash
// exchange, RoutingKey and OrderingKey: the aggregate's id) and published
// by two relays: every aggregate's rows land in one shard, in enqueue
// order.
func TestOrderedRowsKeepAnAggregateInOneShard(t *testing.T) {
	t.Parallel()
	amqptest.RequireConsistentHash(t)
	b := setup(t)
	const shards, accounts, perAccount = 3, 5, 12
	amqptest.DeclareOrdered(t, b.conn, b.queue, shards)
	var msgs []outbox.Message
	for i := range perAccount {
		for a := range accounts {
			account := fmt.Sprintf("acct-%d", a)
			msgs = append(msgs, outbox.Message{
				Exchange: b.queue, RoutingKey: account, OrderingKey: account,
				IdempotencyKey: fmt.Sprintf("%s-%02d", account, i), Body: fmt.Appendf(nil, "%s-%02d", account, i),
			})
		}
	}
	enqueue(t, b.pool, msgs...)
	r1, _ := b.newRelay(t, &Config{BatchSize: 4})
	r2, _ := b.newRelay(t, &Config{BatchSize: 4})
	start(t, r1)
	start(t, r2)
	waitAllSent(t, b.pool, accounts*perAccount)

	shardOf, bodies := amqptest.ShardOf(t, b.conn, b.queue, shards)
	require.Len(t, shardOf, accounts)
	for a := range accounts {
		account := fmt.Sprintf("acct-%d", a)
		want := make([]string, perAccount)
		for i := range want {
			want[i] = fmt.Sprintf("%s-%02d", account, i)
		}
		require.Equal(t, want, bodies[account], "account %s in enqueue order", account)
	}
}
