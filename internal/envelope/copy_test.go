package envelope

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
)

func TestCopy(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	d := &amqp.Delivery{
		Headers:     amqp.Table{"x-a": "a", "x-b": int32(2), inboxtype.HeaderDeliveryCount: int64(3)},
		ContentType: "application/json", ContentEncoding: "gzip", DeliveryMode: amqp.Transient, Priority: 4,
		CorrelationId: "corr", ReplyTo: "replies", Expiration: "60000", MessageId: "m-1", Timestamp: at,
		Type: "payment", UserId: "guest", AppId: "app", Body: []byte("body"),
	}
	got := Copy(d, func(h amqp.Table) {
		delete(h, "x-b")
		h["x-c"] = "c"
	})
	require.Equal(t, amqp.Publishing{
		Headers:     amqp.Table{"x-a": "a", "x-c": "c"},
		ContentType: "application/json", ContentEncoding: "gzip", DeliveryMode: amqp.Persistent, Priority: 4,
		CorrelationId: "corr", ReplyTo: "replies", MessageId: "m-1", Timestamp: at,
		Type: "payment", AppId: "app", Body: []byte("body"),
	}, got, "no delivery count, expiration or user id; persistent")
	require.Equal(t, amqp.Table{"x-a": "a", "x-b": int32(2), inboxtype.HeaderDeliveryCount: int64(3)}, d.Headers,
		"the delivery's headers are left as they were")

	require.Equal(t, amqp.Table{"x-a": "a", "x-b": int32(2)}, Copy(d, nil).Headers)
	require.Equal(t, amqp.Table{}, Copy(&amqp.Delivery{}, nil).Headers)
}
