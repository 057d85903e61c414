package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
)

// jsonKeys decodes a JSON object and returns its keys, sorted.
func jsonKeys(t *testing.T, out string) []string {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &m), out)
	return slices.Sorted(maps.Keys(m))
}

// Every JSON document inboxctl prints names its fields in snake_case, not
// with Go's field names: scripts read these keys.
func TestJSONKeysAreSnakeCase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := amqptest.Dial(t)
	queue := amqptest.QueueName(t)
	ch, err := conn.Channel()
	require.NoError(t, err)
	for _, q := range []string{queue, queue + ".dlq"} {
		_, err = ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(t, err)
	}
	require.NoError(t, ch.Close())
	amqptest.NewPublisher(t, conn).Publish(queue+".dlq", []byte(`{}`), amqp.Publishing{MessageId: "m-1",
		Headers: amqp.Table{inboxtype.HeaderError: "exhausted: boom", inboxtype.HeaderIdempotencyKey: "order:1"}})

	r := b.run(t, "dlq", "replay", queue, "-o", "json")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, []string{"dead_letter_queue", "kept", "queue", "refused", "replayed", "scanned"}, jsonKeys(t, r.out))
	var res map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.out), &res))
	require.InDelta(t, 1, res["replayed"], 0)

	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status, fence, attempts, deliveries, last_error)
		VALUES ('payments', 'payment:7', 'dead', 1, 8, 2, 'exhausted: boom')`)
	r = b.run(t, "status", "payment:7", "--namespace", "payments", "-o", "json")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, []string{
		"attempts", "completed_at", "fence", "first_seen_at", "key", "last_error", "last_failed_at",
		"lease_until", "message_id", "namespace", "owner", "redeliveries", "result", "status", "updated_at",
	}, jsonKeys(t, r.out))
}

// The status of a key names the crash-loop counter for what it counts:
// redeliveries, not every delivery of the key.
func TestStatusNamesTheCrashCounter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status, fence, attempts, deliveries)
		VALUES ('payments', 'payment:8', 'failed', 1, 5, 0)`)
	r := b.run(t, "status", "payment:8", "--namespace", "payments")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Regexp(t, `(?m)^attempts \(broker attempt\):\s+5$`, r.out)
	require.Regexp(t, `(?m)^redeliveries \(crash counter\):\s+0$`, r.out)
	require.NotRegexp(t, `(?m)^deliveries:`, r.out)
}

// Counts and limits outside their range are refused with a usage error
// naming the flag, before anything is touched.
func TestFlagRangesAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"dlq", "list", "payments", "--limit", "-5"}, "--limit"},
		{[]string{"dlq", "replay", "payments", "--count", "-1"}, "--count"},
		{[]string{"dlq", "replay", "payments", "--max-replays", "-2"}, "--max-replays"},
		{[]string{"purge", "--older-than", "1h", "--batch-size", "0"}, "--batch-size"},
		{[]string{"purge", "--older-than", "1h", "--batch-size", "-5"}, "--batch-size"},
		{[]string{"reconcile", "--batch-size", "0"}, "--batch-size"},
		{[]string{"reconcile", "--max-attempts", "0"}, "--max-attempts"},
		{[]string{"reconcile", "--max-attempts", "-2"}, "--max-attempts"},
		{[]string{"reconcile", "--grace", "-1s"}, "--grace"},
		{[]string{"stale", "--older-than", "-1m"}, "--older-than"},
	} {
		r := b.run(t, tc.args...)
		require.Equal(t, exitUsage, r.code, "%v: %s", tc.args, r.errOut)
		require.Contains(t, r.errOut, tc.msg, tc.args)
		require.Empty(t, r.out, fmt.Sprint(tc.args))
	}
}
