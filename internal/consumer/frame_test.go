package consumer_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
)

// bigHeaders are about 128 KB of headers that the broker accepts (they fit
// in its default frame of 131072 bytes) but that leave no room for the
// failure headers of a copy.
func bigHeaders(extra amqp.Table) amqp.Table {
	h := amqp.Table{
		"x-big":       strings.Repeat("a", 100_000),
		"x-bigger":    strings.Repeat("b", 30_700),
		"x-tenant":    "acme",
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	}
	for k, v := range extra {
		h[k] = v
	}
	return h
}

// A message whose dead-letter copy would not fit in one frame is still
// dead-lettered, once, with x-error saying its headers were trimmed
// (largest first; our own headers and the trace context kept); the
// consumer never loses its connection over it.
func TestConsumer_CopyTooLargeForTheFrameIsTrimmedAndDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error {
		return errors.New("unreachable: the body does not decode")
	}), fastOpts())
	c := b.start(t, r, nil)
	b.pub.Publish(b.queue, []byte(`{"id":`), amqp.Publishing{MessageId: "huge", Headers: bigHeaders(nil)})

	o := b.rec.next(t)
	require.Equal(t, inboxtype.ActionDeadLettered, o.Outcome.Action, "dead-lettered at the first try: %v", o.Outcome.Err)
	b.stop(t, c)

	dead := amqptest.Drain(t, b.conn, b.queue+".dlq")
	require.Len(t, dead, 1)
	h := dead[0].Headers
	xerr, _ := h[inboxtype.HeaderError].(string)
	require.True(t, strings.HasPrefix(xerr, "decode: "), xerr)
	require.True(t, strings.HasSuffix(xerr, "; original headers trimmed: 1 dropped"), xerr)
	require.NotContains(t, h, "x-big", "the largest original header went")
	require.Equal(t, strings.Repeat("b", 30_700), h["x-bigger"], "one drop was enough")
	require.Equal(t, "acme", h["x-tenant"])
	require.Contains(t, h, "traceparent")
	require.Equal(t, b.queue, h[inboxtype.HeaderOriginalQueue])
	require.Equal(t, int64(1), h[inboxtype.HeaderAttempt])
	require.Equal(t, []byte(`{"id":`), dead[0].Body)
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue), "the original is gone from the work queue")
	require.Equal(t, []inboxtype.ConnState{inboxtype.ConnConnected, inboxtype.ConnStopped}, b.rec.drainStates(),
		"connected once, never lost the connection")
}

// A retry copy is sized against the frame in the same way: the message
// goes through its delay tier trimmed, and the handler sees why.
func TestConsumer_RetryCopyTooLargeForTheFrameIsTrimmed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seen := make(chan amqp.Table, 4)
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		seen <- m.Headers
		if m.Attempt == 1 {
			return errors.New("gateway timeout")
		}
		return nil
	}), fastOpts())
	c := b.start(t, r, nil)
	b.pub.Publish(b.queue, []byte(`{"id":"r","amount":1}`), amqp.Publishing{MessageId: "huge", Headers: bigHeaders(nil)})

	require.Equal(t, inboxtype.ActionRetried, b.rec.next(t).Outcome.Action)
	require.Equal(t, inboxtype.ActionAcked, b.rec.next(t).Outcome.Action)
	b.stop(t, c)
	<-seen
	h := <-seen
	require.Equal(t, "error: gateway timeout; original headers trimmed: 1 dropped", h[inboxtype.HeaderError])
	require.NotContains(t, h, "x-big")
	require.Equal(t, "acme", h["x-tenant"])
	require.Equal(t, []inboxtype.ConnState{inboxtype.ConnConnected, inboxtype.ConnStopped}, b.rec.drainStates())
}
