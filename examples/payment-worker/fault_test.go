package main

import (
	"encoding/json"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// subscribeFailed binds a private queue to the payment.failed events.
func (b *testBundle) subscribeFailed(t *testing.T) <-chan amqp.Delivery {
	t.Helper()
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(q.Name, "payment.failed", b.events, false, nil))
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	require.NoError(t, err)
	return deliveries
}

// A declined payment (a 4xx: permanent) and an exhausted one (503 on its
// last attempt) each publish exactly one payment.failed event, with the
// key, the reason and the attempt; paid orders publish none.
func TestWorkerFaultEventsForDeclinedAndExhausted(t *testing.T) {
	t.Parallel()
	gw := &gateway{calls: map[string][]string{}, paid: map[string]int{}}
	srv := newLoopbackServer(t, gw)
	b := setup(t, "GATEWAY_URL="+srv, "FAULT_EVENTS=on")
	b.migrate(t)
	w := b.start(t)
	failed := b.subscribeFailed(t)

	publish := func(p Payment, headers amqp.Table) {
		body, err := json.Marshal(p)
		require.NoError(t, err)
		b.pub.Publish(b.queue, body, amqp.Publishing{MessageId: newID(), Headers: headers})
	}
	publish(Payment{OrderID: "reject-1", AmountCents: 100, Currency: "EUR"}, nil)
	// Its last attempt (the default policy allows 8): a 503 exhausts it.
	publish(Payment{OrderID: "down-1", AmountCents: 100, Currency: "EUR"}, amqp.Table{inboxtype.HeaderAttempt: int32(8)})
	publish(Payment{OrderID: "ok-1", AmountCents: 100, Currency: "EUR"}, nil)

	events := map[string]inboxmq.FaultEvent{}
	ids := map[string]string{}
	timeout := time.After(testenv.Timeout())
	for len(events) < 2 {
		select {
		case d := <-failed:
			var ev inboxmq.FaultEvent
			require.NoError(t, json.Unmarshal(d.Body, &ev))
			require.NotContains(t, events, ev.Key, "one event per dead-lettered payment")
			events[ev.Key] = ev
			ids[ev.Key] = d.MessageId
		case <-timeout:
			t.Fatalf("payment.failed events: got %v", events)
		}
	}
	testenv.WaitFor(t, "both dead-lettered and the paid one done", func() bool {
		return amqptest.Depth(t, b.conn, b.queue+".dlq") == 2 &&
			b.count(t, `SELECT count(*) FROM payments WHERE order_id = 'ok-1'`) == 1
	})

	declined := events["payment:reject-1"]
	require.Equal(t, "gateway_4xx", declined.Reason)
	require.Equal(t, 1, declined.Attempts)
	require.Contains(t, declined.Error, "HTTP 422")
	require.NotEmpty(t, declined.FirstFailedAt)
	require.NotEmpty(t, declined.LastFailedAt)
	require.Nil(t, declined.Body, "no body unless configured")

	exhausted := events["payment:down-1"]
	require.Equal(t, "exhausted", exhausted.Reason)
	require.Equal(t, 8, exhausted.Attempts)
	require.Contains(t, exhausted.Error, "HTTP 503")
	require.Equal(t, b.queue, exhausted.Queue)
	require.NotEqual(t, ids["payment:reject-1"], ids["payment:down-1"])

	// Nothing else comes: the paid order publishes no fault.
	select {
	case d := <-failed:
		t.Fatalf("unexpected payment.failed event: %s", d.Body)
	case <-time.After(time.Second):
	}
	w.stop(t)
}
