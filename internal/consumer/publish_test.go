package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// Many copies published at once, some to a missing queue: each publish
// learns whether its own copy was returned, and the copies carry no header
// of ours to match them.
func TestPublisher_MatchesReturnsToTheirPublishWithoutHeader(t *testing.T) {
	t.Parallel()
	conn := amqptest.Dial(t)
	queue := amqptest.QueueName(t)
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(queue, false, false, false, false, amqp.Table{"x-expires": int32(60_000)})
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = ch.QueueDelete(queue, false, false, false); _ = ch.Close() })

	pub, err := consumer.NewCopyPublisher(conn, testenv.Timeout(), 4)
	require.NoError(t, err)
	defer pub.Close()
	const n = 64
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			target := queue
			if i%3 == 0 {
				target = queue + ".missing"
			}
			errs[i] = pub.Publish(context.Background(), target, amqp.Publishing{
				MessageId: fmt.Sprint(i), Headers: amqp.Table{"x-n": int64(i)}, Body: []byte("x"),
			})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if i%3 == 0 {
			require.ErrorIs(t, err, consumer.ErrReturned, "copy %d went to a missing queue", i)
		} else {
			require.NoError(t, err, "copy %d", i)
		}
	}
	got := amqptest.Drain(t, conn, queue)
	require.Len(t, got, n-(n+2)/3)
	for _, d := range got {
		require.Equal(t, amqp.Table{"x-n": d.Headers["x-n"]}, d.Headers, "only the copy's own headers")
	}
}
