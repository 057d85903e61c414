package main

import (
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
)

func TestDLQCommands(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := amqptest.Dial(t)
	queue := amqptest.QueueName(t)
	dlq := queue + ".dlq"
	ch, err := conn.Channel()
	require.NoError(t, err)
	for _, q := range []string{queue, dlq} {
		_, err = ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(t, err)
	}
	require.NoError(t, ch.Close())
	pub := amqptest.NewPublisher(t, conn)
	for i, reason := range []string{"exhausted", "decode", "exhausted"} {
		pub.Publish(dlq, fmt.Appendf(nil, `{"id":"%d"}`, i), amqp.Publishing{MessageId: fmt.Sprintf("m-%d", i), Headers: amqp.Table{
			inboxtype.HeaderIdempotencyKey: fmt.Sprintf("order:%d", i),
			inboxtype.HeaderError:          reason + ": boom",
			inboxtype.HeaderAttempt:        int32(5),
			inboxtype.HeaderOriginalQueue:  queue,
		}})
	}

	r := b.run(t, "dlq", "list", queue)
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, dlq+": 3 messages\n")
	require.Regexp(t, `(?m)^m-1\s+order:1\s+5\s+0\s+decode: boom$`, r.out)
	r = b.run(t, "dlq", "list", queue, "--limit", "2", "-o", "json")
	require.Equal(t, exitOK, r.code, r.errOut)
	var list struct {
		Messages    int              `json:"messages"`
		DeadLetters []deadLetterView `json:"dead_letters"`
	}
	r.json(t, &list)
	require.Equal(t, 3, list.Messages)
	require.Len(t, list.DeadLetters, 2)
	require.Equal(t, "order:0", list.DeadLetters[0].Key)
	require.Equal(t, 3, amqptest.Depth(t, conn, dlq), "list removes nothing")

	r = b.run(t, "dlq", "replay", queue, "--key", "order:1", "-o", "json")
	require.Equal(t, exitOK, r.code, r.errOut)
	var res replayView
	r.json(t, &res)
	require.Equal(t, 1, res.Replayed)
	require.Equal(t, 1, amqptest.Depth(t, conn, queue))

	r = b.run(t, "dlq", "replay", queue, "--reason", "exhausted", "--count", "1")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, "replayed 1 of")
	require.Equal(t, 2, amqptest.Depth(t, conn, queue))
	require.Equal(t, 1, amqptest.Depth(t, conn, dlq))

	r = b.run(t, "dlq", "purge", queue, "--yes")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, fmt.Sprintf("purged 1 messages from %s\n", dlq), r.out)
	require.Zero(t, amqptest.Depth(t, conn, dlq))

	r = b.run(t, "dlq", "list", queue+"-missing")
	require.Equal(t, exitNotFound, r.code, r.errOut)
	r = b.run(t, "dlq", "purge", queue+"-missing", "--yes")
	require.Equal(t, exitNotFound, r.code, r.errOut)
}
