package ops_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/ops"
	"github.com/inboxmq/inboxmq/internal/pgtest"
)

// Peeking returns every message to the queue, in order, whole: bodies cut
// for display are cut only in the copy returned.
func TestPeekQueue_ReturnsEveryMessageIntact(t *testing.T) {
	t.Parallel()
	conn := amqptest.Dial(t)
	q := amqptest.QueueName(t) + ".dlq"
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(q, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.Close())
	pub := amqptest.NewPublisher(t, conn)
	for i := range 3 {
		pub.Publish(q, fmt.Appendf(nil, `{"id":"%d","pad":"xxxxxxxx"}`, i), amqp.Publishing{MessageId: fmt.Sprint("m-", i), Headers: amqp.Table{
			inboxtype.HeaderIdempotencyKey: fmt.Sprint("order:", i), inboxtype.HeaderError: "exhausted: boom",
		}})
	}

	p, err := ops.PeekQueue(conn, q, 2, 8)
	require.NoError(t, err)
	require.Equal(t, 3, p.Messages)
	require.Len(t, p.DeadLetters, 2)
	require.Equal(t, "m-0", p.DeadLetters[0].MessageID)
	require.Equal(t, "order:0", p.DeadLetters[0].Key)
	require.Equal(t, "exhausted", p.DeadLetters[0].Group())
	require.Equal(t, []byte(`{"id":"0`), p.DeadLetters[0].Body)
	require.Equal(t, 27, p.DeadLetters[0].Bytes)

	got := amqptest.Drain(t, conn, q)
	require.Len(t, got, 3, "nothing lost")
	for i, d := range got {
		require.Equal(t, fmt.Sprint("m-", i), d.MessageId, "order kept")
		require.Equal(t, fmt.Sprintf(`{"id":"%d","pad":"xxxxxxxx"}`, i), string(d.Body))
		require.Equal(t, fmt.Sprint("order:", i), d.Headers[inboxtype.HeaderIdempotencyKey])
	}

	_, err = ops.PeekQueue(conn, q+"-missing", 0, 0)
	require.ErrorIs(t, err, ops.ErrQueueNotFound)
	_, err = ops.PurgeQueue(conn, q+"-missing")
	require.ErrorIs(t, err, ops.ErrQueueNotFound)
}

// A missing queue reads as absent and does not stop the queues after it.
func TestDepths_MissingQueueInBetween(t *testing.T) {
	t.Parallel()
	conn := amqptest.Dial(t)
	q := amqptest.QueueName(t)
	ch, err := conn.Channel()
	require.NoError(t, err)
	for _, n := range []string{q, q + ".dlq"} {
		_, err = ch.QueueDeclare(n, true, false, false, false, nil)
		require.NoError(t, err)
	}
	require.NoError(t, ch.Close())
	amqptest.NewPublisher(t, conn).Publish(q+".dlq", []byte(`{}`), amqp.Publishing{})
	d, err := ops.Depths(conn, []string{q, q + ".retry.1s", q + ".dlq"})
	require.NoError(t, err)
	require.Equal(t, []ops.QueueDepth{
		{Name: q, Exists: true},
		{Name: q + ".retry.1s"},
		{Name: q + ".dlq", Exists: true, Messages: 1},
	}, d)
}

func TestReasonGroupAndFilter(t *testing.T) {
	t.Parallel()
	for reason, want := range map[string]string{
		"exhausted: gateway down": "exhausted",
		"expired (broker)":        "expired (broker)",
		"":                        "(no reason)",
		"decode: a: b":            "decode",
	} {
		require.Equal(t, want, ops.ReasonGroup(reason), reason)
	}
	reasons := []string{"exhausted: x", "exhausted_more: y", "expired (broker)"}
	require.Equal(t, "exhausted: ", ops.GroupFilter("exhausted", reasons), "the filter does not take exhausted_more")
	require.Equal(t, "expired (broker)", ops.GroupFilter("expired (broker)", reasons))
	require.Empty(t, ops.GroupFilter("(no reason)", reasons))
}

// The console's reads are cut off by the statement timeout instead of
// loading a busy database, and run read-only.
func TestBounded_TimeoutAndReadOnly(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Schema(t)
	err := ops.Bounded(t.Context(), pool, 50*time.Millisecond, func(tx pgx.Tx) error {
		_, err := tx.Exec(t.Context(), `SELECT pg_sleep(5)`)
		return err
	})
	require.ErrorContains(t, err, "statement timeout")
	err = ops.Bounded(t.Context(), pool, time.Second, func(tx pgx.Tx) error {
		_, err := tx.Exec(t.Context(), `INSERT INTO inboxmq_blocks (consumer, pattern) VALUES ('c', 'p')`)
		return err
	})
	require.ErrorContains(t, err, "read-only")
}

func TestSummarizeSearchAndPayload(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Schema(t)
	s, err := inbox.NewStore(pool, nil)
	if err == nil {
		err = s.Check(t.Context())
	}
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `INSERT INTO inboxmq_inbox (consumer, key, status, completed_at, last_failed_at, payload) VALUES
		('c', 'a:1', 'completed', now() - interval '30 seconds', NULL, 'abcdef'),
		('c', 'a:2', 'completed', now() - interval '3 minutes', NULL, NULL),
		('c', 'b:1', 'failed', NULL, now(), NULL),
		('d', 'a:3', 'dead', NULL, NULL, NULL)`)
	require.NoError(t, err)
	err = ops.Bounded(t.Context(), pool, time.Second, func(tx pgx.Tx) error {
		sum, err := ops.Summarize(t.Context(), tx, s.Table(), "c")
		require.NoError(t, err)
		require.Equal(t, ops.Summary{Namespace: "c", Completed: 2, Failed: 1, Completed1m: 1, Completed5m: 2, Failed1m: 1, Failed5m: 1}, *sum)
		rows, err := ops.SearchKeys(t.Context(), tx, s.Table(), "c", "a:", "", 10)
		require.NoError(t, err)
		require.Len(t, rows, 2)
		rows, err = ops.SearchKeys(t.Context(), tx, s.Table(), "c", "a:", "a:1", 10)
		require.NoError(t, err)
		require.Equal(t, "a:2", rows[0].Key)
		p, err := ops.StoredPayload(t.Context(), tx, s.Table(), "c", "a:1", 3)
		require.NoError(t, err)
		require.Equal(t, ops.Payload{Bytes: 6, Kept: true, Head: []byte("abc")}, p)
		p, err = ops.StoredPayload(t.Context(), tx, s.Table(), "c", "a:2", 3)
		require.NoError(t, err)
		require.False(t, p.Kept)
		st, err := ops.KeyStatuses(t.Context(), tx, s.Table(), "c", []string{"a:1", "b:1", "zz"})
		require.NoError(t, err)
		require.Equal(t, map[string]string{"a:1": "completed", "b:1": "failed"}, st)
		names, err := ops.Namespaces(t.Context(), tx, s.Table(), 10)
		require.NoError(t, err)
		require.Equal(t, []string{"c", "d"}, names)
		return nil
	})
	require.NoError(t, err)
}
