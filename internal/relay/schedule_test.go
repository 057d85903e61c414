package relay

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/logtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/outbox"
)

// retryCopy is a message with every property a retry copy keeps.
func retryCopy(id string) *amqp.Publishing {
	return &amqp.Publishing{
		Headers:         amqp.Table{"x-attempt": int64(2), "x-error": "db_connection: gone", "tenant": "t1"},
		ContentType:     "application/json",
		ContentEncoding: "identity",
		DeliveryMode:    amqp.Persistent,
		Priority:        3,
		CorrelationId:   "corr-1",
		ReplyTo:         "replies",
		MessageId:       id,
		Timestamp:       time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC),
		Type:            "payment",
		AppId:           "shop",
		Body:            []byte(`{"order_id":"o1"}`),
	}
}

func TestSchedulePublishesTheCopyAsItWasWhenDue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, _ := b.newRelay(t, &Config{PollInterval: time.Hour}) // only the due-time wake-up can send it
	start(t, r)

	var before time.Time
	require.NoError(t, b.pool.QueryRow(t.Context(), "SELECT clock_timestamp()").Scan(&before))
	msg := retryCopy("m-1")
	require.NoError(t, r.Schedule(t.Context(), b.queue, 2, 300*time.Millisecond, msg))
	var due, available time.Time
	require.NoError(t, b.pool.QueryRow(t.Context(), "SELECT created_at, available_at FROM inboxmq_outbox").Scan(&due, &available))
	require.Equal(t, due, available, "created_at is the due time")
	require.False(t, due.Before(before.Add(300*time.Millisecond)), "due %s, scheduled after %s", due, before)

	d := getOne(t, b.conn, b.queue)
	require.Equal(t, msg.MessageId, d.MessageId, "the original's message id, not the row's")
	require.Equal(t, msg.CorrelationId, d.CorrelationId)
	require.Equal(t, msg.ReplyTo, d.ReplyTo)
	require.Equal(t, msg.Type, d.Type)
	require.Equal(t, msg.AppId, d.AppId)
	require.Equal(t, msg.ContentType, d.ContentType)
	require.Equal(t, msg.ContentEncoding, d.ContentEncoding)
	require.Equal(t, msg.Priority, d.Priority)
	require.Equal(t, msg.DeliveryMode, d.DeliveryMode)
	require.True(t, msg.Timestamp.Equal(d.Timestamp), "the original's timestamp: %s", d.Timestamp)
	require.Equal(t, msg.Body, d.Body)
	for k, v := range msg.Headers {
		require.Equal(t, v, d.Headers[k], "header %s", k)
	}
	waitAllSent(t, b.pool, 1)
	require.InDelta(t, 1.0, testutil.ToFloat64(r.metrics.published), 0)
}

func TestScheduleNamesTheRowByMessageAndAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, _ := b.newRelay(t, nil) // not started: rows stay pending

	require.NoError(t, r.Schedule(t.Context(), b.queue, 2, time.Hour, retryCopy("m-1")))
	require.NoError(t, r.Schedule(t.Context(), b.queue, 2, time.Minute, retryCopy("m-1")), "the same retry again (a crash before the ack)")
	require.Equal(t, 1, countRows(t, b.pool, "true"), "one row per message and attempt")
	require.Equal(t, 1, countRows(t, b.pool, "available_at > now() + interval '30 minutes'"), "a pending row is left as it is")
	bl, err := outbox.ReadBacklog(t.Context(), b.pool)
	require.NoError(t, err)
	require.Zero(t, bl.Pending, "a retry not yet due is not part of the backlog")

	require.NoError(t, r.Schedule(t.Context(), b.queue, 3, time.Hour, retryCopy("m-1")))
	require.NoError(t, r.Schedule(t.Context(), "other-queue", 2, time.Hour, retryCopy("m-1")))
	require.Equal(t, 3, countRows(t, b.pool, "true"), "another attempt, another queue: rows of their own")

	// A deferral repeats its attempt: once the first row went out, the
	// same name is taken up again.
	_, err = b.pool.Exec(t.Context(), "UPDATE inboxmq_outbox SET sent_at = now() WHERE routing_key = $1 AND properties->>'message_id' = 'm-1' AND headers IS NOT NULL", b.queue)
	require.NoError(t, err)
	require.NoError(t, r.Schedule(t.Context(), b.queue, 2, time.Minute, retryCopy("m-1")))
	require.Equal(t, 1, countRows(t, b.pool, "sent_at IS NULL AND available_at < now() + interval '30 minutes'"), "the sent row is pending again, due in a minute")

	// Without a message id nothing names the copy: each gets a row.
	require.NoError(t, r.Schedule(t.Context(), b.queue, 1, time.Hour, retryCopy("")))
	require.NoError(t, r.Schedule(t.Context(), b.queue, 1, time.Hour, retryCopy("")))
	require.Equal(t, 2, countRows(t, b.pool, "properties->>'message_id' IS NULL"))
}

func TestScheduleWithoutThePropertiesColumn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(t.Context(), "ALTER TABLE inboxmq_outbox DROP COLUMN properties")
	require.NoError(t, err)
	r, _ := b.newRelay(t, nil)
	start(t, r)

	// The relay claims without the column, once it found it missing.
	enqueue(t, b.pool, msgTo(b.queue, "k1"))
	require.Equal(t, "k1", string(getOne(t, b.conn, b.queue).Body))

	err = r.Schedule(t.Context(), b.queue, 2, time.Second, retryCopy("m-1"))
	require.ErrorIs(t, err, errNoProperties, "the caller falls back to the delay queues")
	require.Equal(t, 1, countRows(t, b.pool, "true"), "nothing scheduled")
}

// getOne waits for one message on queue and acks it.
func getOne(t *testing.T, conn *amqp.Connection, queue string) amqp.Delivery {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	var d amqp.Delivery
	testenv.WaitFor(t, "a message on "+queue, func() bool {
		var ok bool
		d, ok, err = ch.Get(queue, true)
		require.NoError(t, err)
		return ok
	})
	return d
}

// A scheduled retry the broker refuses (its queue's leader moving) is
// tried again within seconds, not after the relay's growing per-row
// backoff, and on a new connection: a channel may keep refusing a quorum
// queue whose leader it lost track of.
func TestScheduleNackedRetryIsTriedAgainSoonOnANewConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	full := b.queue + ".full" // refuses every publish
	_, err = ch.QueueDeclare(full, true, false, false, false, amqp.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"})
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = ch.QueueDelete(full, false, false, false) })

	logger, logs := logtest.New(slog.LevelInfo)
	r, _ := b.newRelay(t, &Config{Logger: logger, Concurrency: 1, RetryMinDelay: time.Minute, RetryMaxDelay: time.Hour})
	start(t, r)
	require.NoError(t, r.Schedule(t.Context(), full, 2, 0, retryCopy("m-1")))
	testenv.WaitFor(t, "the retry nacked", func() bool { return countRows(t, b.pool, "attempts > 0 AND last_error LIKE 'nack%'") == 1 })
	require.Equal(t, 1, countRows(t, b.pool, "available_at <= clock_timestamp() + interval '2 seconds'"),
		"due again within seconds, not after RetryMinDelay")
	testenv.WaitFor(t, "the lane connected again", func() bool { return len(logs.Message("outbox relay connected")) >= 2 })

	_, err = ch.QueueDelete(full, false, false, false)
	require.NoError(t, err)
	_, err = ch.QueueDeclare(full, true, false, false, false, nil)
	require.NoError(t, err)
	require.Equal(t, "m-1", getOne(t, b.conn, full).MessageId, "published once the queue takes it")
}
