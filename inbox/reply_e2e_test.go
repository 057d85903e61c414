package inbox_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// requestTwice publishes body to queue as an RPC request, waits for its
// reply, then publishes a copy (a duplicate, its own correlation id) and
// waits for that reply; it returns both replies' bodies.
func requestTwice(t *testing.T, conn *amqp.Connection, pub *amqptest.Publisher, queue string, body []byte) (first, dup string) {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	replies, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	require.NoError(t, err)
	bodies := make([]string, 2)
	for i, corr := range []string{"first", "dup"} {
		pub.Publish(queue, body, amqp.Publishing{MessageId: corr, ReplyTo: q.Name, CorrelationId: corr})
		d := testenv.WaitChan(t, replies, "the reply to "+corr)
		require.Equal(t, corr, d.CorrelationId)
		bodies[i] = string(d.Body)
	}
	return bodies[0], bodies[1]
}

// Through the consumer with replies at their defaults (consumer.ReplyOpts{}:
// the body is Delivery.Result), the first request's reply, a duplicate's
// reply and the row carry the bytes the handler set, on every path of the
// inbox.
func TestReply_FirstAndDuplicateCarryTheHandlersBytes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	conn := amqptest.Dial(t)
	pub := amqptest.NewPublisher(t, conn)
	for _, p := range resultPaths(b) {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			queue := amqptest.QueueName(t)
			r := consumer.NewRouter()
			consumer.Register(r, queue, p.h, &consumer.HandlerOpts{Namespace: p.name, Reply: &consumer.ReplyOpts{}})
			c, err := consumer.New(&consumer.Config{URL: testenv.AMQPURL(), Router: r})
			require.NoError(t, err)
			require.NoError(t, c.Start(t.Context()))
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = c.Stop(ctx)
			})

			o := order{OrderID: p.name, Amount: 1}
			body, err := json.Marshal(o)
			require.NoError(t, err)
			first, dup := requestTwice(t, conn, pub, queue, body)
			require.Equal(t, oddResult, first, "the first reply carries the handler's bytes")
			require.Equal(t, oddResult, dup, "a duplicate's reply carries the same bytes")
			require.Equal(t, oddResult, string(b.get(t, p.name, o.IdempotencyKey()).Result), "as does the row")
			require.Equal(t, p.effects, b.count(t, `SELECT count(*) FROM effects WHERE key = $1`, o.IdempotencyKey()), "the effect, once")
		})
	}
}
