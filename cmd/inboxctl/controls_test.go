package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

func TestControlCommands(t *testing.T) {
	t.Parallel()
	b := setup(t)

	r := b.run(t, "pause", "payments", "--reason", "incident 7")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, "paused payments\n", r.out)

	r = b.run(t, "concurrency", "payments", "2", "-o", "json")
	require.Equal(t, exitOK, r.code, r.errOut)
	var ctl control.Control
	r.json(t, &ctl)
	require.True(t, ctl.Paused)
	require.Equal(t, 2, ctl.Concurrency)
	require.Contains(t, ctl.UpdatedBy, "inboxctl:tester@")

	r = b.run(t, "concurrency", "payments", "0")
	require.Equal(t, "restored the configured concurrency of payments\n", r.out)
	r = b.run(t, "resume", "payments")
	require.Equal(t, "resumed payments\n", r.out)

	r = b.run(t, "block", "payment:42", "--consumer", "payments", "--reason", "dispute")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, "blocked key \"payment:42\" for payments\n", r.out)
	r = b.run(t, "block", "--prefix", "tenant:9:", "--consumer", "payments")
	require.Equal(t, "blocked prefix \"tenant:9:\" for payments\n", r.out)

	r = b.run(t, "controls", "-o", "json")
	require.Equal(t, exitOK, r.code, r.errOut)
	var snap control.Snapshot
	r.json(t, &snap)
	require.Len(t, snap.Controls, 1)
	require.False(t, snap.Controls[0].Paused)
	require.Zero(t, snap.Controls[0].Concurrency)
	require.Len(t, snap.Blocks, 2)
	r = b.run(t, "controls")
	require.Regexp(t, `(?m)^payments\s+false\s+configured\s+inboxctl:tester@\S+\s*$`, r.out)
	require.Regexp(t, `(?m)^payments\s+payment:42\s+false\s+\S+\s+dispute$`, r.out)
	require.NotContains(t, r.out, "BREAKER", "no breakers published: no table")

	require.NoError(t, control.NewStore(b.pool).SetBreaker(t.Context(), control.BreakerState{
		Consumer: "payments", Downstream: "gateway", Worker: "w1", State: "half-open",
	}))
	r = b.run(t, "controls")
	require.Regexp(t, `(?m)^payments\s+gateway\s+w1\s+half-open\s+\S+$`, r.out)
	r = b.run(t, "controls", "-o", "json")
	var withBreakers struct {
		Breakers []control.BreakerState `json:"breakers"`
	}
	r.json(t, &withBreakers)
	require.Len(t, withBreakers.Breakers, 1)
	require.Equal(t, "half-open", withBreakers.Breakers[0].State)

	r = b.run(t, "unblock", "payment:42", "--consumer", "payments", "--no-release")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, "unblocked \"payment:42\" for payments\n", r.out)
	r = b.run(t, "unblock", "payment:42", "--consumer", "payments", "--no-release", "-o", "json")
	require.JSONEq(t, `{"consumer":"payments","pattern":"payment:42","prefix":false,"removed":false,"released":0}`, r.out)

	r = b.run(t, "pause", "bad name")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.errOut, "invalid argument")
}

// unblock releases the parked messages of the key to the work queue.
func TestUnblockReleasesParkedMessages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := amqptest.Dial(t)
	queue := amqptest.QueueName(t)
	parked := control.ParkedQueueName(queue)
	ch, err := conn.Channel()
	require.NoError(t, err)
	for _, q := range []string{queue, parked} {
		_, err = ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(t, err)
	}
	t.Cleanup(func() { _, _ = ch.QueueDelete(parked, false, false, false); _ = ch.Close() })
	pub := amqptest.NewPublisher(t, conn)
	for _, k := range []string{"order:1", "order:2", "order:1"} {
		pub.Publish(parked, fmt.Appendf(nil, `{"k":%q}`, k), amqp.Publishing{Headers: amqp.Table{
			inboxtype.HeaderIdempotencyKey: k, control.HeaderParkedReason: "blocked",
		}})
	}
	require.Equal(t, exitOK, b.run(t, "block", "order:1", "--consumer", "orders").code)

	r := b.run(t, "unblock", "order:1", "--consumer", "orders", "--queue", queue)
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, fmt.Sprintf("unblocked \"order:1\" for orders\nreleased 2 parked messages to %s\n", queue), r.out)
	require.Equal(t, 1, amqptest.Depth(t, conn, parked))
	got := amqptest.Drain(t, conn, queue)
	require.Len(t, got, 2)
	require.NotContains(t, got[0].Headers, control.HeaderParkedReason)
	require.Equal(t, "order:1", got[0].Headers[inboxtype.HeaderIdempotencyKey])
}

type pauseOrder struct {
	ID string `json:"id"`
}

func (o pauseOrder) IdempotencyKey() string { return "order:" + o.ID }

// pickupBound is the documented time within which running workers apply a
// control change (docs/operations.md, package control).
const pickupBound = 2 * time.Second

// signalTarget forwards to the consumer and reports each applied call.
type signalTarget struct {
	control.Target
	applied chan string
}

func (s *signalTarget) Pause(q string) error {
	err := s.Target.Pause(q)
	s.applied <- "pause"
	return err
}

// inboxctl pause stops a real, running consumer within the documented
// pickup time, and resume starts it again.
func TestPauseAndResumeDriveARunningConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := amqptest.Dial(t)
	queue := amqptest.QueueName(t)
	var handled atomic.Int64
	processed := make(chan string, 16)
	router := consumer.NewRouter()
	consumer.Register(router, queue, inboxtype.HandlerFunc[pauseOrder](func(_ context.Context, m *inboxtype.Message[pauseOrder]) error {
		handled.Add(1)
		processed <- m.Key
		return nil
	}), &consumer.HandlerOpts{Queue: consumer.QueueOpts{Concurrency: 4}})
	c, err := consumer.New(&consumer.Config{URL: testenv.AMQPURL(), Router: router, SoftStopTimeout: -1})
	require.NoError(t, err)
	require.NoError(t, c.Start(t.Context()))
	t.Cleanup(func() { require.NoError(t, c.Stop(context.Background())) })

	target := &signalTarget{Target: c, applied: make(chan string, 8)}
	w, err := control.NewWatcher(b.pool, &control.WatcherConfig{Target: target, Queues: control.QueuesOf(router)})
	require.NoError(t, err)
	require.NoError(t, w.Start(t.Context()))
	t.Cleanup(func() { require.NoError(t, w.Stop(context.Background())) })

	pub := amqptest.NewPublisher(t, conn)
	pub.Publish(queue, []byte(`{"id":"1"}`), amqp.Publishing{})
	require.Equal(t, "order:1", testenv.WaitChan(t, processed, "first message processed"))

	r := b.run(t, "pause", queue)
	require.Equal(t, exitOK, r.code, r.errOut)
	select {
	case call := <-target.applied:
		require.Equal(t, "pause", call)
	case <-time.After(pickupBound):
		require.FailNow(t, "pause not applied within the documented pickup time", pickupBound)
	}
	require.True(t, c.Paused(queue))
	// The broker consumer is cancelled: nobody consumes the queue any more.
	consumers := func() int {
		ch, err := conn.Channel()
		require.NoError(t, err)
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		require.NoError(t, err)
		return q.Consumers
	}
	testenv.WaitFor(t, "broker consumer cancelled", func() bool { return consumers() == 0 })
	pub.Publish(queue, []byte(`{"id":"2"}`), amqp.Publishing{})
	require.Equal(t, 1, amqptest.Depth(t, conn, queue), "paused: the message waits in the queue")
	require.Equal(t, int64(1), handled.Load())

	r = b.run(t, "concurrency", queue, "2")
	require.Equal(t, exitOK, r.code, r.errOut)
	testenv.WaitFor(t, "concurrency applied", func() bool { return c.Concurrency(queue) == 2 })

	r = b.run(t, "resume", queue)
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, "order:2", testenv.WaitChan(t, processed, "processing resumes"))
	require.False(t, c.Paused(queue))

	require.Equal(t, exitOK, b.run(t, "concurrency", queue, "0").code)
	testenv.WaitFor(t, "configured concurrency restored", func() bool { return c.Concurrency(queue) == 4 })
}
