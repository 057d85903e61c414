package inboxtype_test

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
)

// Why a dead letter died and where it came from, whether inboxmq or the
// broker dead-lettered it.
func TestDeadLetterReasonAndOrigin(t *testing.T) {
	t.Parallel()
	death := func(queue, reason string) amqp.Table {
		return amqp.Table{"queue": queue, "reason": reason, "count": int64(1), "exchange": ""}
	}
	tests := []struct {
		name              string
		headers           amqp.Table
		wantReason, wantQ string
	}{
		{"none", nil, "", ""},
		{"inboxmq", amqp.Table{inboxtype.HeaderError: "decode: bad json", inboxtype.HeaderOriginalQueue: "q"}, "decode: bad json", "q"},
		{"inboxmq after a retry tier", amqp.Table{
			inboxtype.HeaderError: "exhausted: down", inboxtype.HeaderOriginalQueue: "q",
			"x-death": []any{death("q.retry.1s", "expired")}, "x-first-death-queue": "q.retry.1s", "x-first-death-reason": "expired",
		}, "exhausted: down", "q"},
		{"broker expired", amqp.Table{
			"x-death": []any{death("q", "expired")}, "x-first-death-queue": "q", "x-first-death-reason": "expired",
		}, "expired (broker)", "q"},
		{"broker delivery limit after a retry", amqp.Table{
			inboxtype.HeaderError: "retry: down", inboxtype.HeaderOriginalQueue: "q",
			"x-death":             []any{death("q", "delivery_limit"), death("q.retry.1s", "expired")},
			"x-first-death-queue": "q.retry.1s", "x-first-death-reason": "expired",
		}, "delivery_limit (broker)", "q"},
		{"malformed x-death, first-death headers", amqp.Table{
			"x-death": []any{"junk"}, "x-first-death-queue": "q", "x-first-death-reason": "maxlen",
		}, "maxlen (broker)", "q"},
		{"x-death of the wrong type", amqp.Table{"x-death": amqp.Table{"reason": "expired"}}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.wantReason, inboxtype.DeadLetterReason(tt.headers))
			require.Equal(t, tt.wantQ, inboxtype.DeadLetterOrigin(tt.headers))
		})
	}
}
