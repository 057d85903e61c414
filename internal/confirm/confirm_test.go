package confirm_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/amqpdial"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/confirm"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

type testBundle struct {
	conn  *amqp.Connection
	pool  *confirm.Pool
	queue string // declared
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	b := &testBundle{conn: amqptest.Dial(t), queue: amqptest.QueueName(t)}
	declare(t, b.conn, b.queue, nil)
	pool, err := confirm.NewPool(b.conn, 1, 1)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b.pool = pool
	return b
}

func declare(t *testing.T, conn *amqp.Connection, queue string, args amqp.Table) {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	if args == nil {
		args = amqp.Table{}
	}
	args["x-expires"] = int32(60_000)
	_, err = ch.QueueDeclare(queue, false, false, false, false, args)
	require.NoError(t, err)
}

func to(queue, id string) confirm.Message {
	return confirm.Message{RoutingKey: queue, Mandatory: true, Publishing: amqp.Publishing{MessageId: id, Body: []byte(id)}}
}

func bodies(ds []amqp.Delivery) []string {
	out := make([]string, 0, len(ds))
	for _, d := range ds {
		out = append(out, string(d.Body))
	}
	return out
}

// Each message of a batch gets its own answer: confirmed, returned
// (matched by destination, even under a message id another message of the
// batch has), nacked by a full queue, or refused before the write because
// it cannot fit in a frame; the channel then serves the next batch.
func TestPublishBatch_AnswersEachMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	full := amqptest.QueueName(t)
	declare(t, b.conn, full, amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"})
	missing := b.queue + ".missing"
	big := to(b.queue, "big")
	big.Publishing.Headers = amqp.Table{"x-big": strings.Repeat("x", b.conn.Config.FrameSize)}

	msgs := []confirm.Message{
		to(b.queue, "a"), to(missing, "dup"), to(b.queue, "dup"), to(full, "f1"), to(full, "f2"), big, to(b.queue, "z"),
	}
	errs, err := b.pool.PublishBatch(t.Context(), msgs, nil)
	require.NoError(t, err)
	require.Len(t, errs, len(msgs))
	require.NoError(t, errs[0])
	var ret *confirm.ReturnedError
	require.ErrorAs(t, errs[1], &ret)
	require.Equal(t, missing, ret.Return.RoutingKey)
	require.NoError(t, errs[2], "the routable message with the returned one's id")
	require.NoError(t, errs[3])
	require.ErrorIs(t, errs[4], confirm.ErrNacked)
	var tooLarge *confirm.TooLargeError
	require.ErrorAs(t, errs[5], &tooLarge)
	require.Equal(t, b.conn.Config.FrameSize, tooLarge.FrameMax)
	require.NoError(t, errs[6])
	require.Equal(t, []string{"a", "dup", "z"}, bodies(amqptest.Drain(t, b.conn, b.queue)))

	require.NoError(t, b.pool.Publish(t.Context(), "", b.queue, true, amqp.Publishing{Body: []byte("next")}))
	err = b.pool.Publish(t.Context(), "", missing, true, amqp.Publishing{Body: []byte("lost")})
	require.ErrorAs(t, err, &ret, "a single publish's return")
	require.NoError(t, b.pool.Publish(t.Context(), "", missing, false, amqp.Publishing{Body: []byte("dropped")}),
		"without mandatory an unroutable message is confirmed")
	require.Equal(t, []string{"next"}, bodies(amqptest.Drain(t, b.conn, b.queue)))
}

// A publish to a missing exchange makes the broker close the channel: the
// messages from there on have no answer, and say why; the pool opens a new
// channel for the next publish.
func TestPublishBatch_ClosedChannel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msgs := []confirm.Message{to(b.queue, "a"), to(b.queue, "b"), to(b.queue, "c")}
	msgs[1].Exchange = "missing-" + b.queue
	errs, err := b.pool.PublishBatch(t.Context(), msgs, nil)
	var closed *confirm.ClosedError
	require.ErrorAs(t, err, &closed)
	require.NotNil(t, closed.Reason)
	require.Equal(t, amqp.NotFound, closed.Reason.Code)
	for _, e := range errs[1:] {
		require.ErrorIs(t, e, err)
	}

	require.NoError(t, b.pool.Publish(t.Context(), "", b.queue, true, amqp.Publishing{Body: []byte("next")}))
	require.Contains(t, bodies(amqptest.Drain(t, b.conn, b.queue)), "next")
}

// With a Holder, a batch goes to the socket in one write and every message
// is confirmed.
func TestPublishBatch_HeldIsOneWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d, err := amqpdial.New(amqpdial.Config{URL: testenv.AMQPURL()})
	require.NoError(t, err)
	conn, sock, _, err := d.DialHeld(t.Context(), "inboxmq-test "+t.Name(), amqpdial.RoleAdmin)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	pool, err := confirm.NewPool(conn, 1, 1)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	const n = 50
	msgs := make([]confirm.Message, n)
	want := make([]string, n)
	for i := range msgs {
		want[i] = strings.Repeat("m", i+1)
		msgs[i] = to(b.queue, want[i])
	}
	h := &countingHold{sock: sock}
	errs, err := pool.PublishBatch(t.Context(), msgs, h)
	require.NoError(t, err)
	require.Equal(t, make([]error, n), errs)
	require.Equal(t, int64(1), h.writes, "one write for the batch")
	require.Equal(t, want, bodies(amqptest.Drain(t, b.conn, b.queue)))
}

// countingHold counts the socket writes of a hold.
type countingHold struct {
	sock   *amqpdial.HoldConn
	before int64
	writes int64
}

func (h *countingHold) Hold() {
	h.before = h.sock.Writes()
	h.sock.Hold()
}

func (h *countingHold) Release() error {
	err := h.sock.Release()
	h.writes = h.sock.Writes() - h.before
	return err
}

// A batch whose held write fails has no answer: every message has the
// write's error, and no confirm is waited for.
func TestPublishBatch_FailedWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msgs := []confirm.Message{to(b.queue, "a"), to(b.queue, "b")}
	errs, err := b.pool.PublishBatch(t.Context(), msgs, failingHold{})
	require.ErrorContains(t, err, "write the batch")
	require.Equal(t, []error{err, err}, errs)
}

type failingHold struct{}

func (failingHold) Hold()          {}
func (failingHold) Release() error { return errors.New("broken pipe") }

// A publish whose ctx ends before its confirm returns ctx's error.
func TestPublish_CtxEnded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := b.pool.Publish(ctx, "", b.queue, true, amqp.Publishing{Body: []byte("x")})
	require.ErrorIs(t, err, context.Canceled)
}
