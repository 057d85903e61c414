package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// OnDeadLetter runs after the copy is confirmed and before the ack; when
// it fails, the original is requeued, dead-lettered again on its
// redelivery, and the hook runs again with the same delivery: what it
// writes can be derived again with the same identity.
func TestConsumer_OnDeadLetterFailureRequeuesAndRunsAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	var seen []consumer.DeadLetter
	opts := fastOpts()
	opts.OnDeadLetter = func(_ context.Context, dl consumer.DeadLetter) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, dl)
		if len(seen) == 1 {
			return errors.New("outbox unavailable")
		}
		return nil
	}
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error {
		return retry.Permanent(errors.New("card declined"))
	}), opts)
	c := b.start(t, r, nil)
	b.publish(t, b.queue, `{"id":"p1","amount":5}`)

	o := b.rec.next(t)
	require.Equal(t, inboxtype.ActionRequeued, o.Outcome.Action, "not acked while the hook failed")
	o = b.rec.next(t)
	require.Equal(t, inboxtype.ActionDeadLettered, o.Outcome.Action)
	b.stop(t, c)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 2)
	for _, dl := range seen {
		require.Equal(t, "order:p1", dl.Delivery.Key)
		require.Equal(t, "m-"+`{"id":"p1","amount":5}`, dl.Delivery.MessageID)
		require.Equal(t, retry.KindPermanent, dl.Decision.Kind)
		require.Equal(t, "permanent: card declined", dl.Headers[inboxtype.HeaderError])
		require.NotEmpty(t, dl.Headers[inboxtype.HeaderLastFailedAt])
	}
	require.Len(t, amqptest.Drain(t, b.conn, b.queue+".dlq"), 2, "a copy per dead-lettering")
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue), "acked in the end")
}

// Replies: a request that succeeds and a duplicate each get a reply under
// their own correlation id, carrying the result; a failed request gets
// none; a message without reply_to is acked as before.
func TestConsumer_ReplyCarriesTheResult(t *testing.T) {
	t.Parallel()
	b := setup(t)
	opts := fastOpts()
	opts.Reply = &consumer.ReplyOpts{}
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		switch m.Body.ID {
		case "bad":
			require.NoError(t, m.SetResult("never sent"))
			return retry.Permanent(errors.New("declined"))
		case "dup":
			m.Delivery.Result = json.RawMessage(`{"stored":true}`)
			return retry.Duplicate(retry.SourceInbox, errors.New("done before"))
		}
		return m.SetResult(map[string]string{"id": m.Body.ID})
	}), opts)
	b.start(t, r, nil)

	ch, err := b.conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	replies, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	require.NoError(t, err)

	for _, m := range []struct{ body, corr string }{{`{"id":"ok"}`, "c-ok"}, {`{"id":"dup"}`, "c-dup"}, {`{"id":"bad"}`, "c-bad"}} {
		b.pub.Publish(b.queue, []byte(m.body), amqp.Publishing{MessageId: m.corr, ReplyTo: q.Name, CorrelationId: m.corr})
	}
	b.pub.Publish(b.queue, []byte(`{"id":"plain"}`), amqp.Publishing{MessageId: "plain"})
	for range 4 {
		b.rec.next(t)
	}
	got := map[string]string{}
	timeout := time.After(testenv.Timeout())
	for len(got) < 2 {
		select {
		case d := <-replies:
			got[d.CorrelationId] = string(d.Body)
		case <-timeout:
			t.Fatalf("replies: %v", got)
		}
	}
	require.Equal(t, map[string]string{"c-ok": `{"id":"ok"}`, "c-dup": `{"stored":true}`}, got)
	select {
	case d := <-replies:
		t.Fatalf("unexpected reply %q: %s", d.CorrelationId, d.Body)
	case <-time.After(200 * time.Millisecond):
	}
}

// A reply no queue takes (the caller's reply queue is gone) is logged and
// the request acked: there is nobody to answer, and requeueing would loop.
func TestConsumer_ReplyToAGoneQueueIsAcked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	opts := fastOpts()
	opts.Reply = &consumer.ReplyOpts{}
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		return m.SetResult("done")
	}), opts)
	c := b.start(t, r, nil)
	b.pub.Publish(b.queue, []byte(`{"id":"o1"}`), amqp.Publishing{MessageId: "m1", ReplyTo: b.queue + ".gone-reply", CorrelationId: "c1"})

	o := b.rec.next(t)
	require.Equal(t, inboxtype.ActionAcked, o.Outcome.Action)
	require.NoError(t, o.Outcome.Err)
	b.stop(t, c)
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue), "acked, not requeued")
}
