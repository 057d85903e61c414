package controlrun_test

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

func (b *parkBundle) deleteQueue(t *testing.T, q string) {
	t.Helper()
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	_, err = ch.QueueDelete(q, false, false, false)
	require.NoError(t, err)
}

// A parked copy that the broker returns (its parked queue was deleted
// after the parker declared it) is an error, so the original is not acked;
// the next Park declares the queue again and parks.
func TestParker_ReturnedParkedCopyIsAnError(t *testing.T) {
	t.Parallel()
	b := setupPark(t)
	parked := inboxtype.ParkedQueue(b.queue)
	require.NoError(t, b.park(t, "1", nil))
	require.Equal(t, 1, amqptest.Depth(t, b.conn, parked))

	b.deleteQueue(t, parked)
	require.Error(t, b.park(t, "2", nil), "the parked copy was returned: not parked")

	require.NoError(t, b.park(t, "3", nil), "the parker declares its queue again")
	got := amqptest.Drain(t, b.conn, parked)
	require.Len(t, got, 1)
	require.Equal(t, "3", got[0].MessageId)
}
