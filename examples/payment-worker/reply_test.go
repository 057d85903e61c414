package main

import (
	"encoding/json"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/testenv"
)

// replyQueue declares a private reply queue and returns its name and
// deliveries.
func (b *testBundle) replyQueue(t *testing.T) (string, <-chan amqp.Delivery) {
	t.Helper()
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	require.NoError(t, err)
	return q.Name, deliveries
}

// requestThrice publishes the same order three times as RPC requests
// (each its own message id and correlation id, all at once) and returns
// the replies' bodies by correlation id.
func (b *testBundle) requestThrice(t *testing.T, p Payment) map[string]string {
	t.Helper()
	replyTo, replies := b.replyQueue(t)
	body, err := json.Marshal(p)
	require.NoError(t, err)
	corr := []string{"corr-a", "corr-b", "corr-c"}
	for _, c := range corr {
		b.pub.Publish(b.queue, body, amqp.Publishing{MessageId: newID(), ReplyTo: replyTo, CorrelationId: c})
	}
	got := map[string]string{}
	timeout := time.After(testenv.Timeout())
	for len(got) < len(corr) {
		select {
		case d := <-replies:
			require.NotContains(t, got, d.CorrelationId, "one reply per request")
			require.Equal(t, "application/json", d.ContentType)
			got[d.CorrelationId] = string(d.Body)
		case <-timeout:
			t.Fatalf("replies: got %d of %d: %v", len(got), len(corr), got)
		}
	}
	require.ElementsMatch(t, corr, keysOf(got), "each reply under its own request's correlation id")
	return got
}

func keysOf(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// requireIdentical asserts that every reply has the same body and returns
// it decoded.
func requireIdentical(t *testing.T, replies map[string]string) paymentResult {
	t.Helper()
	var first string
	for _, body := range replies {
		if first == "" {
			first = body
		}
		require.Equal(t, first, body, "every copy gets the same stored result")
	}
	var r paymentResult
	require.NoError(t, json.Unmarshal([]byte(first), &r))
	return r
}

func TestWorkerRepliesWithTheStoredResult(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.migrate(t)
	w := b.start(t)

	p := Payment{OrderID: "rpc-1", AmountCents: 500, Currency: "EUR"}
	r := requireIdentical(t, b.requestThrice(t, p))
	require.Equal(t, "rpc-1", r.OrderID)
	require.Equal(t, "completed", r.Status)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM payments WHERE order_id = 'rpc-1'`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM ledger_entries WHERE order_id = 'rpc-1'`))
	w.stop(t)
}

func TestWorkerGatewayRepliesWithTheChargeID(t *testing.T) {
	t.Parallel()
	gw := &gateway{calls: map[string][]string{}, paid: map[string]int{}}
	srv := newLoopbackServer(t, gw)
	b := setup(t, "GATEWAY_URL="+srv)
	b.migrate(t)
	w := b.start(t)

	p := Payment{OrderID: "rpc-2", AmountCents: 700, Currency: "EUR"}
	r := requireIdentical(t, b.requestThrice(t, p))
	require.Equal(t, "ch_rpc-2_1", r.ChargeID, "the gateway's answer to the one charge")
	_, paid := gw.snapshot()
	require.Equal(t, 1, paid["rpc-2"], "one charge")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM payments WHERE order_id = 'rpc-2'`))
	w.stop(t)
}
