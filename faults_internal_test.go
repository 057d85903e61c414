package inboxmq

import (
	"encoding/json"
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/retry"
)

func deadLetter(replays int, body string) consumer.DeadLetter {
	d := inboxtype.NewDelivery("payments", "payments", "w1", &amqp.Delivery{
		MessageId: "m-1", Body: []byte(body),
		Headers: amqp.Table{inboxtype.HeaderReplayCount: int32(replays), "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	})
	d.Key = "payment:1"
	return consumer.DeadLetter{
		Delivery: d,
		Decision: retry.Decision{Kind: retry.KindRetry, Reason: retry.ReasonExhausted, Err: errors.New("HTTP 503")},
		Headers: amqp.Table{
			inboxtype.HeaderError: "exhausted: HTTP 503", inboxtype.HeaderAttempt: int64(8),
			inboxtype.HeaderFirstFailedAt: "2026-12-03T10:00:00Z", inboxtype.HeaderLastFailedAt: "2026-12-03T10:04:00Z",
			inboxtype.HeaderFailedTraceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01",
		},
	}
}

// A redelivery dead-lettered again re-derives the same event id (the
// outbox and the receiver's inbox absorb the repeat); a replay that fails
// again is a new fault with a new id.
func TestFaultMessage_StableIDPerDeadLettering(t *testing.T) {
	t.Parallel()
	o := &FaultOpts{Exchange: "events", RoutingKey: "payment.failed", MaxBody: 16}
	first, err := faultMessage("payments", o, deadLetter(0, `{"order_id":"1"}`))
	require.NoError(t, err)
	again, err := faultMessage("payments", o, deadLetter(0, `{"order_id":"1"}`))
	require.NoError(t, err)
	require.Equal(t, first.IdempotencyKey, again.IdempotencyKey)
	replayed, err := faultMessage("payments", o, deadLetter(1, `{"order_id":"1"}`))
	require.NoError(t, err)
	require.NotEqual(t, first.IdempotencyKey, replayed.IdempotencyKey)

	var ev FaultEvent
	require.NoError(t, json.Unmarshal(first.Body, &ev))
	require.Equal(t, FaultEvent{
		ID:    "fault:8:payments:payment:1:0",
		Queue: "payments", Namespace: "payments", Key: "payment:1", MessageID: "m-1",
		Reason: "exhausted", Error: "exhausted: HTTP 503", Attempts: 8,
		FirstFailedAt: "2026-12-03T10:00:00Z", LastFailedAt: "2026-12-03T10:04:00Z",
	}, ev)
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", first.Headers["traceparent"], "the trace goes on")
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01", first.Headers[inboxtype.HeaderFailedTraceparent],
		"and links to the failed attempt")
}

func TestFaultMessage_BodyOnlyWhenConfiguredAndBounded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		o    FaultOpts
		body string
		want FaultEvent
	}{
		{"off", FaultOpts{MaxBody: 64}, `{"a":1}`, FaultEvent{}},
		{"json", FaultOpts{Body: true, MaxBody: 64}, `{"a":1}`, FaultEvent{Body: json.RawMessage(`{"a":1}`)}},
		{"not json", FaultOpts{Body: true, MaxBody: 64}, "\x00\x01", FaultEvent{BodyBase64: []byte("\x00\x01")}},
		{"too large", FaultOpts{Body: true, MaxBody: 4}, `{"a":1}`, FaultEvent{BodyOmitted: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.o.Exchange, tc.o.RoutingKey = "events", "k"
			m, err := faultMessage("q", &tc.o, deadLetter(0, tc.body))
			require.NoError(t, err)
			var ev FaultEvent
			require.NoError(t, json.Unmarshal(m.Body, &ev))
			require.Equal(t, tc.want.Body, ev.Body)
			require.Equal(t, tc.want.BodyBase64, ev.BodyBase64)
			require.Equal(t, tc.want.BodyOmitted, ev.BodyOmitted)
		})
	}
}
