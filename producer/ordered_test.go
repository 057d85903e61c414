package producer_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/producer"
)

// Published to an ordered route's exchange with the aggregate's id as
// routing key, an aggregate's events all land in one shard, in publish
// order (the consistent-hash exchange hashes the routing key).
func TestPublish_OrderingKeyKeepsAnAggregateInOneShard(t *testing.T) {
	t.Parallel()
	amqptest.RequireConsistentHash(t)
	b := setupNoQueue(t)
	const shards, accounts, perAccount = 3, 6, 10
	amqptest.DeclareOrdered(t, b.conn, b.queue, shards)
	p := b.producer(t, nil)
	for i := range perAccount {
		for a := range accounts {
			account := fmt.Sprintf("acct-%d", a)
			event := fmt.Sprintf("%s-%02d", account, i)
			require.NoError(t, producer.Publish(t.Context(), p, b.queue, account, event, &producer.PublishOpts{Key: event}))
		}
	}
	shardOf, bodies := amqptest.ShardOf(t, b.conn, b.queue, shards)
	require.Len(t, shardOf, accounts)
	for a := range accounts {
		account := fmt.Sprintf("acct-%d", a)
		want := make([]string, perAccount)
		for i := range want {
			want[i] = fmt.Sprintf(`"%s-%02d"`, account, i)
		}
		require.Equal(t, want, bodies[account], "account %s in publish order", account)
	}
}
