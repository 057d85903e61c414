package consumer_test

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// A message the broker dead-lettered because it expired is replayed like
// any dead letter: back to its work queue, without the expiration that
// would expire it again, and processed once.
func TestReplayDLQ_ExpiredDeadLetterIsProcessedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	got := make(chan *amqp.Delivery, 4)
	c := b.startPaused(t, consumer.QueueOpts{}, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		got <- m.Delivery.Raw
		return nil
	}), nil)
	b.pub.Publish(b.queue, []byte(`{"id":"late"}`), amqp.Publishing{MessageId: "late", Expiration: "50"})
	filed := b.rec.next(t)
	require.Equal(t, inboxtype.ActionDeadLettered, filed.Outcome.Action, "the consumer filed the expired message in the DLQ")
	require.Equal(t, "broker_expired", filed.Outcome.Decision.Reason)
	testenv.WaitFor(t, "the expired message in the DLQ", func() bool { return amqptest.Depth(t, b.conn, b.queue+".dlq") == 1 })

	res, err := consumer.ReplayDLQ(t.Context(), b.conn, b.queue, &consumer.ReplayOpts{Reason: "expired"})
	require.NoError(t, err)
	require.Equal(t, consumer.ReplayResult{Scanned: 1, Replayed: 1}, res)
	require.NoError(t, c.Resume(b.queue))

	raw := testenv.WaitChan(t, got, "the replayed message handled")
	require.Equal(t, "late", raw.MessageId)
	require.Empty(t, raw.Expiration, "the replayed copy does not expire again")
	require.NotContains(t, raw.Headers, "x-death")
	require.NotContains(t, raw.Headers, "x-first-death-reason")
	require.Equal(t, 1, inboxtype.HeaderInt(raw.Headers, inboxtype.HeaderReplayCount))
	o := b.rec.next(t)
	require.Equal(t, inboxtype.ActionAcked, o.Outcome.Action)
	b.stop(t, c)
	require.Empty(t, got, "handled once")
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue))
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue+".dlq"))
}

// A DLQ shared by several work queues: replay moves back only the dead
// letters of the queue it names, whether inboxmq or the broker put them
// there.
func TestReplayDLQ_LeavesOtherQueuesDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dlq := b.queue + ".dlq"
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	for _, q := range []string{b.queue, dlq} {
		_, err := ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(t, err)
	}
	require.NoError(t, ch.Close())
	death := func(queue string) []any {
		return []any{amqp.Table{"queue": queue, "reason": "expired", "count": int64(1), "exchange": ""}}
	}
	for id, h := range map[string]amqp.Table{
		"mine":           {inboxtype.HeaderError: "exhausted: x", inboxtype.HeaderOriginalQueue: b.queue},
		"mine-expired":   {"x-death": death(b.queue), "x-first-death-queue": b.queue, "x-first-death-reason": "expired"},
		"theirs":         {inboxtype.HeaderError: "exhausted: x", inboxtype.HeaderOriginalQueue: "other"},
		"theirs-expired": {"x-death": death("other"), "x-first-death-queue": "other", "x-first-death-reason": "expired"},
	} {
		b.pub.Publish(dlq, []byte(`{"id":"`+id+`"}`), amqp.Publishing{MessageId: id, Headers: h})
	}

	res, err := consumer.ReplayDLQ(t.Context(), b.conn, b.queue, nil)
	require.NoError(t, err)
	require.Equal(t, consumer.ReplayResult{Scanned: 4, Replayed: 2, Kept: 2}, res)
	ids := func(ms []amqp.Delivery) []string {
		var out []string
		for _, m := range ms {
			out = append(out, m.MessageId)
		}
		return out
	}
	require.ElementsMatch(t, []string{"mine", "mine-expired"}, ids(amqptest.Drain(t, b.conn, b.queue)))
	require.ElementsMatch(t, []string{"theirs", "theirs-expired"}, ids(amqptest.Drain(t, b.conn, dlq)))
}

// An operator's selection of message ids replays those and keeps the
// rest in the DLQ, in order.
func TestReplayDLQ_SelectsMessageIDs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dlq := b.queue + ".dlq"
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	for _, q := range []string{b.queue, dlq} {
		_, err := ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(t, err)
	}
	require.NoError(t, ch.Close())
	for _, id := range []string{"a", "b", "c"} {
		b.pub.Publish(dlq, []byte(`{}`), amqp.Publishing{MessageId: id, Headers: amqp.Table{inboxtype.HeaderError: "exhausted: x"}})
	}
	res, err := consumer.ReplayDLQ(t.Context(), b.conn, b.queue, &consumer.ReplayOpts{MessageIDs: []string{"a", "c"}})
	require.NoError(t, err)
	require.Equal(t, consumer.ReplayResult{Scanned: 3, Replayed: 2, Kept: 1}, res)
	require.Len(t, amqptest.Drain(t, b.conn, b.queue), 2)
	kept := amqptest.Drain(t, b.conn, dlq)
	require.Len(t, kept, 1)
	require.Equal(t, "b", kept[0].MessageId)
}
