package main

import (
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// A message that expired in its work queue is a dead letter like any
// other: list shows the broker's reason and its queue, replay sends it
// back without the expiration.
func TestDLQCommands_BrokerDeadLetter(t *testing.T) {
	t.Parallel()
	b := &cliBundle{env: map[string]string{"AMQP_URL": testenv.AMQPURL()}}
	conn := amqptest.Dial(t)
	queue := amqptest.QueueName(t)
	dlq := queue + ".dlq"
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(dlq, true, false, false, false, nil)
	require.NoError(t, err)
	_, err = ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
	require.NoError(t, err)
	require.NoError(t, ch.Close())
	amqptest.NewPublisher(t, conn).Publish(queue, []byte(`{"id":"late"}`), amqp.Publishing{MessageId: "late", Expiration: "50"})
	testenv.WaitFor(t, "the expired message in the DLQ", func() bool { return amqptest.Depth(t, conn, dlq) == 1 })

	r := b.run(t, "dlq", "list", queue)
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Regexp(t, `(?m)^late\s+.*expired \(broker\)$`, r.out)
	r = b.run(t, "dlq", "list", queue, "-o", "json")
	require.Equal(t, exitOK, r.code, r.errOut)
	var list struct {
		DeadLetters []deadLetterView `json:"dead_letters"`
	}
	r.json(t, &list)
	require.Len(t, list.DeadLetters, 1)
	require.Equal(t, "expired (broker)", list.DeadLetters[0].Error)
	require.Equal(t, queue, list.DeadLetters[0].OriginalQueue)

	r = b.run(t, "dlq", "replay", queue, "--reason", "expired")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, "replayed 1 of 1")
	m, ok := amqptest.Get(t, conn, queue)
	require.True(t, ok)
	require.Equal(t, "late", m.MessageId)
	require.Empty(t, m.Expiration)
	require.Equal(t, 1, inboxtype.HeaderInt(m.Headers, inboxtype.HeaderReplayCount))
	require.Zero(t, amqptest.Depth(t, conn, dlq))
}

// AMQP_URL may list a cluster's nodes: inboxctl connects to one that
// answers (the first here is down), and a bad entry is a usage error that
// shows no password.
func TestDLQCommands_ClusterURL(t *testing.T) {
	t.Parallel()
	dead := strings.Replace(amqptest.DeadURL(t), "guest:guest@", "guest:s3cret@", 1)
	b := &cliBundle{env: map[string]string{"AMQP_URL": dead + "," + testenv.AMQPURL()}}
	conn := amqptest.Dial(t)
	queue := amqptest.QueueName(t)
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(queue+".dlq", true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.Close())
	amqptest.NewPublisher(t, conn).Publish(queue+".dlq", []byte(`{"id":"x"}`), amqp.Publishing{MessageId: "dead-1"})

	r := b.run(t, "dlq", "list", queue)
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, "dead-1")

	b = &cliBundle{env: map[string]string{"AMQP_URL": "amqp://guest:s3cret@h1/,http://guest:s3cret@h2/"}}
	r = b.run(t, "dlq", "list", queue)
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.errOut, "broker URL 2 of 2")
	require.NotContains(t, r.errOut+r.out, "s3cret")
}
