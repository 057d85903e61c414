package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/controlrun"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// announce runs a heartbeat for a worker of p.Namespaces, as a running
// worker does, until the test ends or stop is called.
func (b *cliBundle) announce(t *testing.T, p control.Presence) (stop func()) {
	t.Helper()
	if p.Host == "" {
		p.Host, p.PID, p.Version = "host-a", 4242, "0.1.0"
	}
	h := controlrun.NewHeartbeat(b.pool, p, nil)
	require.NoError(t, h.Start(t.Context()))
	stop = func() { require.NoError(t, h.Stop(context.Background())) }
	t.Cleanup(stop)
	return stop
}

func TestControlCommands(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.announce(t, control.Presence{ID: "w1", Namespaces: []string{"payments"}, Controls: true})

	r := b.run(t, "pause", "payments", "--reason", "incident 7")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, "paused payments: 1 live worker obeys\n", r.out)
	require.Empty(t, r.errOut)

	r = b.run(t, "concurrency", "payments", "2", "-o", "json")
	require.Equal(t, exitOK, r.code, r.errOut)
	var ctl control.Control
	r.json(t, &ctl)
	require.True(t, ctl.Paused)
	require.Equal(t, 2, ctl.Concurrency)
	require.Contains(t, ctl.UpdatedBy, "inboxctl:tester@")

	r = b.run(t, "concurrency", "payments", "0")
	require.Equal(t, "restored the configured concurrency of payments: 1 live worker obeys\n", r.out)
	r = b.run(t, "resume", "payments")
	require.Equal(t, "resumed payments: 1 live worker obeys\n", r.out)

	r = b.run(t, "block", "payment:42", "--namespace", "payments", "--reason", "dispute")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, "blocked key \"payment:42\" for payments: 1 live worker obeys\n", r.out)
	r = b.run(t, "block", "--prefix", "tenant:9:", "--namespace", "payments")
	require.Equal(t, "blocked prefix \"tenant:9:\" for payments: 1 live worker obeys\n", r.out)

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

	b.exec(t, `INSERT INTO inboxmq_breakers (consumer, downstream, worker, state) VALUES ('payments', 'gateway', 'w1', 'half-open')`)
	r = b.run(t, "controls")
	require.Regexp(t, `(?m)^payments\s+gateway\s+w1\s+half-open\s+\S+$`, r.out)
	r = b.run(t, "controls", "-o", "json")
	var withBreakers struct {
		Breakers []control.BreakerState `json:"breakers"`
	}
	r.json(t, &withBreakers)
	require.Len(t, withBreakers.Breakers, 1)
	require.Equal(t, "half-open", withBreakers.Breakers[0].State)

	r = b.run(t, "unblock", "payment:42", "--namespace", "payments", "--no-release")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, "unblocked \"payment:42\" for payments\n", r.out)
	r = b.run(t, "unblock", "payment:42", "--namespace", "payments", "--no-release", "-o", "json")
	require.JSONEq(t, `{"namespace":"payments","pattern":"payment:42","prefix":false,"removed":false,"released":0}`, r.out)

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
	parked := inboxtype.ParkedQueue(queue)
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
			inboxtype.HeaderIdempotencyKey: k, inboxtype.HeaderParkedReason: "blocked",
		}})
	}
	require.Equal(t, exitOK, b.run(t, "block", "order:1", "--namespace", "orders", "--force").code)

	r := b.run(t, "unblock", "order:1", "--namespace", "orders", "--queue", queue)
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, fmt.Sprintf("unblocked \"order:1\" for orders\nreleased 2 parked messages to %s\n", queue), r.out)
	require.Equal(t, 1, amqptest.Depth(t, conn, parked))
	got := amqptest.Drain(t, conn, queue)
	require.Len(t, got, 2)
	require.NotContains(t, got[0].Headers, inboxtype.HeaderParkedReason)
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
	controlrun.Target
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

	b.announce(t, control.Presence{ID: "worker-1", Namespaces: []string{queue}, Controls: true})
	target := &signalTarget{Target: c, applied: make(chan string, 8)}
	w, err := controlrun.NewWatcher(b.pool, &controlrun.WatcherConfig{Target: target, Queues: controlrun.QueuesOf(router)})
	require.NoError(t, err)
	require.NoError(t, w.Start(t.Context()))
	t.Cleanup(func() { require.NoError(t, w.Stop(context.Background())) })

	pub := amqptest.NewPublisher(t, conn)
	pub.Publish(queue, []byte(`{"id":"1"}`), amqp.Publishing{})
	require.Equal(t, "order:1", testenv.WaitChan(t, processed, "first message processed"))

	r := b.run(t, "pause", queue)
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, "paused "+queue+": 1 live worker obeys\n", r.out)
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

// pause, concurrency and block say how many live workers obey, warn when
// none does (saying why), and refuse a consumer nothing names unless
// --force; workers lists who announced itself.
func TestControlChangesCountTheWorkersThatObey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.announce(t, control.Presence{ID: "w1", Namespaces: []string{"payments", "refunds"}, Controls: true})
	b.announce(t, control.Presence{ID: "w2", Namespaces: []string{"payments"}, Controls: true})
	b.announce(t, control.Presence{ID: "w3", Namespaces: []string{"emails"}, Controls: false})
	stopW4 := b.announce(t, control.Presence{ID: "w4", Namespaces: []string{"reports"}, Controls: true})
	stopW4()

	r := b.run(t, "pause", "payments")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, "paused payments: 2 live workers obey\n", r.out)
	require.Empty(t, r.errOut)

	r = b.run(t, "concurrency", "payments", "2", "-o", "json")
	require.Equal(t, exitOK, r.code, r.errOut)
	var change struct {
		control.Control
		Obeying     []string `json:"obeying"`
		ControlsOff []string `json:"controls_off"`
	}
	r.json(t, &change)
	require.Equal(t, 2, change.Concurrency)
	require.True(t, change.Paused)
	require.Equal(t, []string{"w1", "w2"}, change.Obeying)
	require.Empty(t, change.ControlsOff)

	r = b.run(t, "pause", "emails")
	require.Equal(t, exitOK, r.code, "a warning, not a failure: %s", r.errOut)
	require.Equal(t, "paused emails: no live worker obeys\n", r.out)
	require.Equal(t, "inboxctl: warning: 1 live worker serves emails but has controls off (w3): nothing obeys the change\n", r.errOut)

	r = b.run(t, "block", "k1", "--namespace", "reports")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, "blocked key \"k1\" for reports: no live worker obeys\n", r.out)
	require.Contains(t, r.errOut, "inboxctl: warning: no live worker serves reports", "only a stopped worker serves it")

	r = b.run(t, "pause", "paymnets")
	require.Equal(t, exitNotFound, r.code)
	require.Contains(t, r.errOut, `unknown namespace "paymnets"`)
	require.Contains(t, r.errOut, "known: emails, payments, refunds, reports")
	require.Empty(t, r.out)
	snap, err := control.NewStore(b.pool).List(t.Context())
	require.NoError(t, err)
	for _, c := range snap.Controls {
		require.NotEqual(t, "paymnets", c.Namespace, "nothing written for a refused consumer")
	}
	r = b.run(t, "block", "k", "--namespace", "paymnets")
	require.Equal(t, exitNotFound, r.code)

	r = b.run(t, "pause", "newqueue", "--force")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, "paused newqueue: no live worker obeys\n", r.out)
	require.Contains(t, r.errOut, "no live worker serves newqueue")
	r = b.run(t, "resume", "newqueue")
	require.Equal(t, exitOK, r.code, "its control row names it now: %s", r.errOut)

	r = b.run(t, "workers")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Regexp(t, `(?m)^w1\s+host-a\s+4242\s+payments,refunds\s+0\.1\.0\s+on\s+\S+\s+live$`, r.out)
	require.Regexp(t, `(?m)^w3\s+host-a\s+4242\s+emails\s+0\.1\.0\s+off\s+\S+\s+live$`, r.out)
	require.Regexp(t, `(?m)^w4\s+.*\s+stopped$`, r.out)
	require.Contains(t, r.out, "3 live workers (1 with controls off), 0 stale, 1 stopped\n")
	r = b.run(t, "workers", "-o", "json")
	var workers []control.Presence
	r.json(t, &workers)
	require.Len(t, workers, 4)
	require.Equal(t, "w4", workers[3].ID)
	require.Equal(t, "stopped", workers[3].State)
	var raw []json.RawMessage
	r.json(t, &raw)
	require.Equal(t, []string{"controls", "host", "id", "last_seen", "namespaces", "pid", "started_at", "state", "stopped_at", "version"},
		jsonKeys(t, string(raw[3])), "snake_case keys")
}

// A schema without the presence table (migration 00006 not applied yet)
// still takes a pause: with a warning, without a count or a check.
func TestControlChangeWithoutPresenceTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `DROP TABLE inboxmq_workers`)
	r := b.run(t, "pause", "payments")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, "paused payments\n", r.out)
	require.Contains(t, r.errOut, "inboxctl: warning: cannot tell which workers obey")
	snap, err := control.NewStore(b.pool).List(t.Context())
	require.NoError(t, err)
	require.Len(t, snap.Controls, 1)
	require.True(t, snap.Controls[0].Paused)
}
