package consumer_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
)

// Copies are published on a connection of their own ("<Name> publisher"),
// so a publishing connection blocked by a broker alarm cannot stall acks.
// Losing it fails the session like losing the consuming one: the consumer
// reconnects both and carries on.
func TestConsumer_PublisherConnectionIsSeparateAndSupervised(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error {
		return nil
	}), fastOpts())
	c := b.start(t, r, nil)
	b.rec.waitState(t, inboxtype.ConnConnected)

	amqptest.CloseConnection(t, "inboxmq-test-"+b.queue+" publisher")
	b.rec.waitState(t, inboxtype.ConnDisconnected)
	b.rec.waitState(t, inboxtype.ConnConnected)

	b.publish(t, b.queue, `{"id":"after"}`)
	require.Equal(t, inboxtype.ActionAcked, b.rec.next(t).Outcome.Action)
	b.stop(t, c)
}
