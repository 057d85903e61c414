package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/retry"
)

// The headers of a dead-letter copy: x-attempt keeps its full width
// (int64), no internal header leaks into it, and x-first-failed-at is
// taken from the incoming message only when it is one of our own copies
// (x-original-queue is this queue) with a valid time not in the future.
func TestConsumer_DeadLetterCopyHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	past := time.Now().Add(-time.Hour).UTC().Truncate(time.Second).Format(time.RFC3339Nano)
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)
	cases := []struct {
		id        string
		headers   amqp.Table
		attempt   int64
		keepFirst string // the x-first-failed-at expected; "" means now
	}{
		{id: "wide", headers: amqp.Table{inboxtype.HeaderAttempt: int64(5_000_000_000)}, attempt: 5_000_000_000},
		{id: "producer-set", headers: amqp.Table{inboxtype.HeaderFirstFailedAt: past}, attempt: 1},
		{id: "future", headers: amqp.Table{inboxtype.HeaderFirstFailedAt: future, inboxtype.HeaderOriginalQueue: b.queue}, attempt: 1},
		{id: "garbage", headers: amqp.Table{inboxtype.HeaderFirstFailedAt: "yesterday", inboxtype.HeaderOriginalQueue: b.queue}, attempt: 1},
		{id: "other-queue", headers: amqp.Table{inboxtype.HeaderFirstFailedAt: past, inboxtype.HeaderOriginalQueue: "elsewhere"}, attempt: 1},
		{id: "own-copy", headers: amqp.Table{inboxtype.HeaderFirstFailedAt: past, inboxtype.HeaderOriginalQueue: b.queue}, attempt: 1, keepFirst: past},
		// Retried once through a tier (our own copy), then dead-lettered:
		// the first failure time of the retry copy is kept.
		{id: "retried", attempt: 2},
	}
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		if m.Body.ID == "retried" && m.Attempt == 1 {
			return errors.New("gateway timeout")
		}
		return retry.Permanent(errors.New("card declined"))
	}), fastOpts())
	c := b.start(t, r, nil)
	start := time.Now().Add(-time.Second)
	for _, tc := range cases {
		b.pub.Publish(b.queue, []byte(`{"id":"`+tc.id+`","amount":1}`), amqp.Publishing{MessageId: tc.id, Headers: tc.headers})
	}
	var retryFirst string
	for range len(cases) + 1 {
		o := b.rec.next(t)
		if o.ID == "retried" && o.Outcome.Action == inboxtype.ActionRetried {
			continue
		}
		require.Equal(t, inboxtype.ActionDeadLettered, o.Outcome.Action, o.ID)
		if o.ID == "retried" {
			retryFirst, _ = o.Headers[inboxtype.HeaderFirstFailedAt].(string)
		}
	}
	b.stop(t, c)

	dead := map[string]amqp.Delivery{}
	for _, d := range amqptest.Drain(t, b.conn, b.queue+".dlq") {
		dead[d.MessageId] = d
	}
	require.Len(t, dead, len(cases))
	for _, tc := range cases {
		h := dead[tc.id].Headers
		require.Equal(t, tc.attempt, h[inboxtype.HeaderAttempt], "%s: x-attempt as int64", tc.id)
		for k := range h {
			require.NotContains(t, k, "inboxmq", "%s: internal header %s leaked into the copy", tc.id, k)
		}
		first, ok := h[inboxtype.HeaderFirstFailedAt].(string)
		require.True(t, ok, tc.id)
		switch {
		case tc.id == "retried":
			require.NotEmpty(t, retryFirst)
			require.Equal(t, retryFirst, first, "our own retry copy's first failure is kept")
		case tc.keepFirst != "":
			require.Equal(t, tc.keepFirst, first, tc.id)
		default:
			at, err := time.Parse(time.RFC3339Nano, first)
			require.NoError(t, err, tc.id)
			require.True(t, at.After(start) && !at.After(time.Now()), "%s: x-first-failed-at %s replaced by now", tc.id, first)
		}
	}
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue))
}
