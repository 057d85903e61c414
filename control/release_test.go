package control_test

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/controlrun"
)

// parkBundle is a parker on a connection of its own and a work queue name
// (not declared).
type parkBundle struct {
	conn   *amqp.Connection
	parker *controlrun.Parker
	queue  string
}

func setupPark(t *testing.T) *parkBundle {
	t.Helper()
	b := &parkBundle{conn: amqptest.Dial(t), queue: amqptest.QueueName(t)}
	b.parker = controlrun.NewParker(amqptest.Dial(t))
	t.Cleanup(func() { _ = b.parker.Close() })
	return b
}

// park parks a delivery of b.queue with key "k:"+id.
func (b *parkBundle) park(t *testing.T, id string, raw *amqp.Delivery) error {
	t.Helper()
	if raw == nil {
		raw = &amqp.Delivery{}
	}
	raw.MessageId, raw.Body = id, []byte(`{"id":"`+id+`"}`)
	d := inboxtype.NewDelivery(b.queue, b.queue, "w1", raw)
	d.Key = "k:" + id
	return b.parker.Park(t.Context(), d, control.Block{Namespace: b.queue, Pattern: "k:" + id, Reason: "test"})
}

func (b *parkBundle) declareQueue(t *testing.T, q string) {
	t.Helper()
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	_, err = ch.QueueDeclare(q, true, false, false, false, nil)
	require.NoError(t, err)
}

// Release moves a parked message back with its properties (reply-to,
// priority, correlation id and the rest) and its own headers, without the
// parked headers.
func TestRelease_KeepsTheMessageProperties(t *testing.T) {
	t.Parallel()
	b := setupPark(t)
	b.declareQueue(t, b.queue)
	require.NoError(t, b.park(t, "1", &amqp.Delivery{
		Headers: amqp.Table{"x-custom": "v"}, ContentType: "application/json", ContentEncoding: "identity",
		Priority: 3, CorrelationId: "corr-1", ReplyTo: "replies", Type: "payment", AppId: "app",
	}))

	n, err := control.Release(t.Context(), b.conn, b.queue, nil)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	got := amqptest.Drain(t, b.conn, b.queue)
	require.Len(t, got, 1)
	d := got[0]
	require.Equal(t, []any{"1", "application/json", "identity", uint8(3), "corr-1", "replies", "payment", "app", amqp.Persistent},
		[]any{d.MessageId, d.ContentType, d.ContentEncoding, d.Priority, d.CorrelationId, d.ReplyTo, d.Type, d.AppId, d.DeliveryMode})
	require.Equal(t, amqp.Table{
		"x-custom": "v", inboxtype.HeaderIdempotencyKey: "k:1", inboxtype.HeaderOriginalQueue: b.queue,
	}, d.Headers)
}

// A released message that the broker returns (its work queue is missing)
// stays parked: Release fails and never acks it.
func TestRelease_ReturnedMessageStaysParked(t *testing.T) {
	t.Parallel()
	b := setupPark(t)
	require.NoError(t, b.park(t, "1", nil)) // b.queue itself is never declared

	n, err := control.Release(t.Context(), b.conn, b.queue, nil)
	require.Error(t, err, "the released copy was returned unroutable")
	require.Equal(t, 0, n)
	require.Equal(t, 1, amqptest.Depth(t, b.conn, inboxtype.ParkedQueue(b.queue)), "still parked")
}
