package main

import (
	"encoding/json"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// A body whose amount_cents is a 10 MB number is dead-lettered as
// undecodable, and no log line of the worker grows with it: each stays
// within a few KiB, and none carries a stack trace. The received line of
// a valid order carries its key.
func TestWorkerLogLinesAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.migrate(t)
	w := b.start(t)

	b.pub.Publish(b.queue, []byte(`{"order_id":"huge","amount_cents":`+strings.Repeat("9", 10<<20)+`,"currency":"EUR"}`),
		amqp.Publishing{MessageId: "huge-amount"})
	b.publishOrders(t, "logs", 1, 1)
	testenv.WaitFor(t, "the huge message is dead-lettered and the order paid", func() bool {
		return amqptest.Depth(t, b.conn, b.queue+".dlq") == 1 &&
			b.count(t, `SELECT count(*) FROM payments WHERE order_id LIKE 'logs-%'`) == 1
	})
	w.stop(t)

	var dead, received []map[string]any
	for line := range strings.Lines(w.stderr.String()) {
		require.Less(t, len(line), 4<<10, "a bounded log line: %.300s", line)
		var entry map[string]any
		if json.Unmarshal([]byte(line), &entry) != nil {
			continue
		}
		require.NotContains(t, entry, "stacktrace", "no stack trace: %.300s", line)
		switch entry["status"] {
		case string(inboxtype.StatusDeadLettered):
			dead = append(dead, entry)
		case string(inboxtype.StatusReceived):
			received = append(received, entry)
		}
	}
	require.Len(t, dead, 1)
	require.Equal(t, "huge-amount", dead[0]["message_id"])
	require.Equal(t, "decode", dead[0]["reason"])
	require.Contains(t, dead[0]["error"], "… [truncated from ")
	keyOf := map[any]any{} // message id -> key of its received line
	var keys []any
	for _, r := range received {
		keyOf[r["message_id"]] = r["idempotency_key"]
		keys = append(keys, r["idempotency_key"])
	}
	require.Contains(t, keyOf, "huge-amount", "an undecodable message is received too")
	require.Empty(t, keyOf["huge-amount"])
	require.Contains(t, keys, "payment:logs-000", "the received line of a valid order carries its key")
}
