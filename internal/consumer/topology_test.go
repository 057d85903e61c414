package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/logtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

func TestConsumer_ReconnectsAfterServerSideClose(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pausedQueue := amqptest.QueueName(t)
	gate := make(chan struct{})
	reached := make(chan struct{})
	var gated atomic.Bool
	acked := map[string]bool{}
	r := consumer.NewRouter()
	opts := fastOpts()
	opts.Queue.Concurrency = 1
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		if m.Body.ID == "5" && gated.CompareAndSwap(false, true) {
			close(reached)
			<-gate
		}
		return nil
	}), opts)
	consumer.Register(r, pausedQueue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error {
		return nil
	}), fastOpts())
	c := b.newConsumer(t, r, nil)
	require.NoError(t, c.Pause(pausedQueue))
	require.NoError(t, c.Start(t.Context()))
	b.rec.waitState(t, inboxtype.ConnConnected)
	b.publish(t, pausedQueue, `{"id":"parked"}`)
	for i := range 20 {
		b.publish(t, b.queue, fmt.Sprintf(`{"id":"%d"}`, i))
	}

	testenv.WaitChan(t, reached, "the gated handler")
	amqptest.CloseConnection(t, "inboxmq-test-"+b.queue)
	b.rec.waitState(t, inboxtype.ConnDisconnected)
	close(gate)
	b.rec.waitState(t, inboxtype.ConnConnected)

	for len(acked) < 20 {
		o := b.rec.next(t)
		if o.Outcome.Action == inboxtype.ActionAcked {
			acked[o.ID] = true
		}
	}
	require.True(t, c.Ready())
	require.True(t, c.Paused(pausedQueue), "a paused queue stays paused across reconnects")
	require.Equal(t, 0, consumers(t, b.conn, pausedQueue))
	require.Equal(t, 1, amqptest.Depth(t, b.conn, pausedQueue))
	b.stop(t, c)
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue), "the queue was finished after the reconnect")
}

func TestConsumer_QuorumTopologyHasSafetyArguments(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := consumer.NewRouter()
	opts := fastOpts(100 * time.Millisecond)
	opts.Queue.Type, opts.Queue.DeliveryLimit = consumer.Quorum, 4
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error { return nil }), opts)
	c := b.start(t, r, nil)
	b.stop(t, c)

	// Re-declaring with exactly these arguments succeeds only if the
	// consumer declared them (the broker checks equivalence).
	redeclare := func(name string, args amqp.Table) {
		ch, err := b.conn.Channel()
		require.NoError(t, err)
		defer ch.Close()
		_, err = ch.QueueDeclare(name, true, false, false, false, args)
		require.NoError(t, err, name)
	}
	redeclare(b.queue, amqp.Table{
		"x-queue-type":              "quorum",
		"x-delivery-limit":          int64(4),
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": b.queue + ".dead",
		"x-dead-letter-strategy":    "at-least-once",
		"x-overflow":                "reject-publish",
	})
	redeclare(b.queue+".dead", amqp.Table{
		"x-queue-type":              "quorum",
		"x-delivery-limit":          int64(4),
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": b.queue + ".dlq",
		"x-dead-letter-strategy":    "at-least-once",
		"x-overflow":                "reject-publish",
	})
	redeclare(b.queue+".dlq", amqp.Table{"x-queue-type": "quorum"})
	redeclare(inboxtype.RetryQueue(b.queue, 100*time.Millisecond), amqp.Table{
		"x-queue-type":              "quorum",
		"x-message-ttl":             int64(100),
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": b.queue,
		"x-dead-letter-strategy":    "at-least-once",
		"x-overflow":                "reject-publish",
	})
}

func TestConsumer_ExistingQueueWithOtherArgumentsIsAClearError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(b.queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(99)})
	require.NoError(t, err)
	require.NoError(t, ch.Close())

	r := consumer.NewRouter()
	opts := fastOpts()
	opts.Queue.Type, opts.Queue.DeliveryLimit = consumer.Quorum, 5
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error { return nil }), opts)
	c := b.newConsumer(t, r, nil)
	err = c.Start(t.Context())
	require.Error(t, err)
	require.Contains(t, err.Error(), `"`+b.queue+`"`)
	require.Regexp(t, `different argument x-[a-z-]+ than configured`, err.Error(), "the argument is named")
	require.False(t, c.Ready())
}

// A handler that makes the consumer lose its channel every time never
// settles; the quorum queue's delivery limit ends the loop in the DLQ.
func TestConsumer_QuorumCrashLoopEndsInDLQ(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	r := consumer.NewRouter()
	opts := fastOpts()
	opts.Queue.Type, opts.Queue.DeliveryLimit = consumer.Quorum, 2
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		calls.Add(1)
		ch, ok := m.Delivery.Raw.Acknowledger.(*amqp.Channel)
		require.True(t, ok)
		_ = ch.Close() // the worker "crashes": nothing is settled
		return nil
	}), opts)
	c := b.start(t, r, nil)
	b.publish(t, b.queue, `{"id":"poison"}`)

	testenv.WaitFor(t, "the poison message in the DLQ", func() bool { return amqptest.Depth(t, b.conn, b.queue+".dlq") == 1 })
	b.stop(t, c)
	dead := amqptest.Drain(t, b.conn, b.queue+".dlq")
	require.Len(t, dead, 1)
	deaths, ok := dead[0].Headers["x-death"].([]any)
	require.True(t, ok, "x-death header: %v", dead[0].Headers)
	death, ok := deaths[0].(amqp.Table)
	require.True(t, ok)
	require.Equal(t, "delivery_limit", death["reason"])
	require.LessOrEqual(t, calls.Load(), int32(3), "bounded by the delivery limit")
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue))
}

func TestReplayDLQ_MovesSelectedKeepsOthers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dlq := b.queue + ".dlq"
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	for _, q := range []string{b.queue, dlq} {
		_, err := ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(t, err)
	}
	require.NoError(t, ch.Close())
	dead := func(id, xerr string, replays int) {
		h := amqp.Table{inboxtype.HeaderError: xerr, inboxtype.HeaderIdempotencyKey: "order:" + id, inboxtype.HeaderAttempt: int32(5)}
		if replays > 0 {
			h[inboxtype.HeaderReplayCount] = int32(replays)
		}
		b.pub.Publish(dlq, []byte(`{"id":"`+id+`"}`), amqp.Publishing{MessageId: id, Headers: h})
	}
	dead("a", "decode: bad json", 0)
	dead("b", "exhausted: gateway down", 0)
	dead("c", "exhausted: gateway down", 3)
	dead("d", "exhausted: gateway down", 1)

	res, err := consumer.ReplayDLQ(t.Context(), b.conn, b.queue, &consumer.ReplayOpts{Reason: retry.ReasonExhausted})
	require.NoError(t, err)
	require.Equal(t, consumer.ReplayResult{Scanned: 4, Replayed: 2, Kept: 1, Refused: 1}, res)

	back := amqptest.Drain(t, b.conn, b.queue)
	require.Len(t, back, 2)
	byID := map[string]amqp.Delivery{}
	for _, m := range back {
		byID[m.MessageId] = m
	}
	require.JSONEq(t, `{"id":"b"}`, string(byID["b"].Body), "the body (and key) never change")
	require.Equal(t, 1, inboxtype.HeaderInt(byID["b"].Headers, inboxtype.HeaderAttempt))
	require.Equal(t, 1, inboxtype.HeaderInt(byID["b"].Headers, inboxtype.HeaderReplayCount))
	require.Equal(t, 2, inboxtype.HeaderInt(byID["d"].Headers, inboxtype.HeaderReplayCount))
	require.NotContains(t, byID["b"].Headers, inboxtype.HeaderError)

	left := amqptest.Drain(t, b.conn, dlq)
	require.Len(t, left, 2)
	kept := map[string]amqp.Table{}
	for _, m := range left {
		kept[m.MessageId] = m.Headers
	}
	require.Equal(t, "decode: bad json", kept["a"][inboxtype.HeaderError])
	require.NotContains(t, kept["a"], "x-replay-refused")
	require.Equal(t, true, kept["c"]["x-replay-refused"])

	// Limit and Key select too.
	dead("e", "exhausted: x", 0)
	dead("f", "exhausted: x", 0)
	res, err = consumer.ReplayDLQ(t.Context(), b.conn, b.queue, &consumer.ReplayOpts{Key: "order:f", Limit: 1})
	require.NoError(t, err)
	require.Equal(t, consumer.ReplayResult{Scanned: 2, Replayed: 1, Kept: 1}, res)
	m, ok := amqptest.Get(t, b.conn, b.queue)
	require.True(t, ok)
	require.Equal(t, "f", m.MessageId)
	require.Equal(t, 1, amqptest.Depth(t, b.conn, dlq))
}

func TestConsumer_PauseResumeAndConcurrency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan string, 16)
	release := make(chan struct{})
	r := consumer.NewRouter()
	opts := fastOpts()
	opts.Queue.Concurrency = 3
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		started <- m.Body.ID
		<-release
		return nil
	}), opts)
	c := b.start(t, r, nil)
	require.Equal(t, 3, c.Concurrency(b.queue))
	require.Error(t, c.SetConcurrency(b.queue, 4))
	require.Error(t, c.SetConcurrency("nope", 1))
	require.Error(t, c.Pause("nope"))
	require.NoError(t, c.SetConcurrency(b.queue, 1))
	require.Equal(t, 1, c.Concurrency(b.queue))

	for i := range 3 {
		b.publish(t, b.queue, fmt.Sprintf(`{"id":"%d"}`, i))
	}
	testenv.WaitChan(t, started, "the first handler")
	select {
	case id := <-started:
		t.Fatalf("handler %s started beyond the concurrency limit of 1", id)
	case <-time.After(200 * time.Millisecond): // a negative check needs a bound
	}
	require.NoError(t, c.SetConcurrency(b.queue, 0), "0 restores the configured 3")
	require.Equal(t, 3, c.Concurrency(b.queue))
	testenv.WaitChan(t, started, "the second handler")
	testenv.WaitChan(t, started, "the third handler")

	require.NoError(t, c.Pause(b.queue))
	require.True(t, c.Paused(b.queue))
	close(release) // in-flight ones finish and settle normally while paused
	for range 3 {
		require.Equal(t, inboxtype.ActionAcked, b.rec.next(t).Outcome.Action)
	}
	testenv.WaitFor(t, "basic.cancel", func() bool { return consumers(t, b.conn, b.queue) == 0 })
	b.publish(t, b.queue, `{"id":"p1"}`)
	b.publish(t, b.queue, `{"id":"p2"}`)
	require.Equal(t, 2, amqptest.Depth(t, b.conn, b.queue), "nothing is taken while paused")
	require.True(t, c.Ready(), "a paused queue still counts as ready")

	require.NoError(t, c.Resume(b.queue))
	require.False(t, c.Paused(b.queue))
	for range 2 {
		require.Equal(t, inboxtype.ActionAcked, b.rec.next(t).Outcome.Action)
	}
	b.stop(t, c)
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue))
}

// The broker cancels the consumer when its queue is deleted; the consumer
// reconnects, re-declares the topology and resumes by itself.
func TestConsumer_BrokerCancelRedeclaresAndResumes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error {
		return nil
	}), fastOpts())
	c := b.start(t, r, nil)
	b.rec.waitState(t, inboxtype.ConnConnected)

	ch, err := b.conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDelete(b.queue, false, false, false)
	require.NoError(t, err)
	require.NoError(t, ch.Close())
	b.rec.waitState(t, inboxtype.ConnDisconnected)
	b.rec.waitState(t, inboxtype.ConnConnected)

	testenv.WaitFor(t, "the queue re-declared and consumed", func() bool { return consumers(t, b.conn, b.queue) == 1 })
	b.publish(t, b.queue, `{"id":"after-cancel"}`)
	o := b.rec.next(t)
	require.Equal(t, inboxtype.ActionAcked, o.Outcome.Action)
	require.Equal(t, "after-cancel", o.ID)
	b.stop(t, c)
}

// startPaused declares the topology of b.queue (of the queue type and
// arguments of q) through a consumer that does not consume it: no worker
// takes its messages until Resume. h nil handles every message with
// success.
func (b *testBundle) startPaused(t *testing.T, q consumer.QueueOpts, h inboxtype.Handler[order], mutate func(*consumer.Config)) *consumer.Consumer {
	t.Helper()
	if h == nil {
		h = inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error { return nil })
	}
	r := consumer.NewRouter()
	opts := fastOpts()
	opts.Queue.Type, opts.Queue.Arguments = q.Type, q.Arguments
	if q.Type == consumer.Quorum {
		opts.Queue.DeliveryLimit = 4
	}
	consumer.Register(r, b.queue, h, opts)
	c := b.newConsumer(t, r, mutate)
	require.NoError(t, c.Pause(b.queue))
	require.NoError(t, c.Start(t.Context()))
	return c
}

// requireBrokerDeath checks that m was dead-lettered by the broker from
// queue for reason, without its per-message expiration.
func requireBrokerDeath(t *testing.T, m amqp.Delivery, queue, reason string) {
	t.Helper()
	deaths, ok := m.Headers["x-death"].([]any)
	require.True(t, ok, "x-death header: %v", m.Headers)
	require.NotEmpty(t, deaths)
	death, ok := deaths[0].(amqp.Table)
	require.True(t, ok, "x-death entry: %v", deaths[0])
	require.Equal(t, reason, death["reason"])
	require.Equal(t, queue, death["queue"])
	require.Equal(t, reason, m.Headers["x-first-death-reason"])
	require.Empty(t, m.Expiration, "the broker strips the expiration when it dead-letters")
}

// A message that expires in the work queue while no worker runs (a
// per-message expiration set by its producer, or the queue's own TTL), or
// that a length limit pushes out, is moved to the DLQ by the broker,
// classic and quorum alike, never dropped.
func TestConsumer_ExpiredMessageLandsInDLQ(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		typ        consumer.QueueType
		args       map[string]any
		expiration string
		reason     string
	}{
		{"classic per-message expiration", consumer.Classic, nil, "50", "expired"},
		{"quorum per-message expiration", consumer.Quorum, nil, "50", "expired"},
		{"classic queue TTL", consumer.Classic, map[string]any{"x-message-ttl": int64(50)}, "", "expired"},
		{"classic length limit", consumer.Classic, map[string]any{"x-max-length": int64(1)}, "", "maxlen"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			c := b.startPaused(t, consumer.QueueOpts{Type: tt.typ, Arguments: tt.args}, nil, nil)
			b.pub.Publish(b.queue, []byte(`{"id":"late"}`), amqp.Publishing{MessageId: "late", Expiration: tt.expiration})
			if tt.reason == "maxlen" {
				b.pub.Publish(b.queue, []byte(`{"id":"next"}`), amqp.Publishing{MessageId: "next"})
			}

			testenv.WaitFor(t, "the message in the DLQ", func() bool { return amqptest.Depth(t, b.conn, b.queue+".dlq") == 1 })
			b.stop(t, c)
			dead := amqptest.Drain(t, b.conn, b.queue+".dlq")
			require.Len(t, dead, 1)
			require.Equal(t, "late", dead[0].MessageId)
			require.JSONEq(t, `{"id":"late"}`, string(dead[0].Body))
			requireBrokerDeath(t, dead[0], b.queue, tt.reason)
			require.Equal(t, tt.reason+" (broker)", inboxtype.DeadLetterReason(dead[0].Headers))
			require.Equal(t, b.queue, inboxtype.DeadLetterOrigin(dead[0].Headers))
		})
	}
}

// The classic work queue is declared with a dead-letter route into its
// dead queue, and the dead queue with one into the DLQ.
func TestConsumer_ClassicTopologyHasDeadLetterRoute(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.startPaused(t, consumer.QueueOpts{}, nil, nil)
	b.stop(t, c)
	redeclare := func(name string, args amqp.Table) {
		ch, err := b.conn.Channel()
		require.NoError(t, err)
		defer ch.Close()
		_, err = ch.QueueDeclare(name, true, false, false, false, args)
		require.NoError(t, err, "the broker checks equivalence: only the consumer's own arguments pass (%s)", name)
	}
	redeclare(b.queue, amqp.Table{
		"x-queue-type":              "classic",
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": b.queue + ".dead",
	})
	redeclare(b.queue+".dead", amqp.Table{
		"x-queue-type":              "classic",
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": b.queue + ".dlq",
	})
}

// A work queue as v0.1.0 declared it, dead-lettering straight into the
// DLQ, does not stop the consumer: it is kept, with a warning that says
// what it costs and how to move on.
func TestConsumer_QueueOfV010IsKeptWithAWarning(t *testing.T) {
	t.Parallel()
	for _, typ := range []consumer.QueueType{consumer.Classic, consumer.Quorum} {
		t.Run(string(typ), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			args := amqp.Table{"x-queue-type": string(typ), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": b.queue + ".dlq"}
			if typ == consumer.Quorum {
				args["x-delivery-limit"] = int64(4) // as startPaused declares it
				args["x-dead-letter-strategy"] = "at-least-once"
				args["x-overflow"] = "reject-publish"
			}
			ch, err := b.conn.Channel()
			require.NoError(t, err)
			_, err = ch.QueueDeclare(b.queue, true, false, false, false, args)
			require.NoError(t, err)
			require.NoError(t, ch.Close())

			logger, logs := logtest.New(slog.LevelWarn)
			c := b.startPaused(t, consumer.QueueOpts{Type: typ}, nil, func(cfg *consumer.Config) { cfg.Logger = logger })
			require.True(t, c.Ready())
			warned := logs.Containing("declared by inboxmq 0.1.0")
			require.Len(t, warned, 1, "one warning at start: %v", logs.All())
			require.Equal(t, b.queue, warned[0].Attrs["queue"])
			b.stop(t, c)
		})
	}
}

// A classic work queue declared before v0.1.0 (no dead-letter route) does
// not stop the consumer from starting: it warns with the migration, and
// the policy it names makes an expiring message land in the DLQ.
func TestConsumer_LegacyClassicQueueStartsAndPolicyMigratesIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(b.queue, true, false, false, false, amqp.Table{"x-queue-type": "classic"})
	require.NoError(t, err)
	require.NoError(t, ch.Close())

	logger, logs := logtest.New(slog.LevelWarn)
	c := b.startPaused(t, consumer.QueueOpts{}, nil, func(cfg *consumer.Config) { cfg.Logger = logger })
	require.True(t, c.Ready())
	warned := logs.Containing("without a dead-letter route")
	require.Len(t, warned, 1, "one warning at start: %v", logs.All())
	fields := warned[0].Attrs
	require.Equal(t, b.queue, fields["queue"])
	require.Contains(t, fields["migration"], `"dead-letter-routing-key":"`+b.queue+`.dead"`)
	require.Contains(t, fields["migration"], "rabbitmqctl set_policy")

	amqptest.SetQueuePolicy(t, b.queue, `{"dead-letter-exchange":"","dead-letter-routing-key":"`+b.queue+`.dead"}`)
	b.pub.Publish(b.queue, []byte(`{"id":"late"}`), amqp.Publishing{MessageId: "late", Expiration: "50"})
	testenv.WaitFor(t, "the expired message in the DLQ", func() bool { return amqptest.Depth(t, b.conn, b.queue+".dlq") == 1 })
	b.stop(t, c)
	dead := amqptest.Drain(t, b.conn, b.queue+".dlq")
	require.Len(t, dead, 1)
	requireBrokerDeath(t, dead[0], b.queue, "expired")
}

// A classic queue that lacks the dead-letter route and also differs in
// another argument is not the legacy shape: a start-up error naming it.
func TestConsumer_LegacyQueueWithOtherArgumentsIsAClearError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(b.queue, true, false, false, false, amqp.Table{"x-queue-type": "classic", "x-max-length": int64(5)})
	require.NoError(t, err)
	require.NoError(t, ch.Close())

	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error { return nil }), fastOpts())
	c := b.newConsumer(t, r, nil)
	err = c.Start(t.Context())
	require.ErrorContains(t, err, "different argument x-max-length than configured")
	require.False(t, c.Ready())
}

// A restriction (the breaker's) and the operator's pause are kept apart:
// lifting one never undoes the other, and a restriction's limit applies
// below the operator's concurrency.
func TestConsumer_RestrictKeepsReasonsApart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := consumer.NewRouter()
	opts := fastOpts()
	opts.Queue.Concurrency = 3
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error {
		return nil
	}), opts)
	c := b.start(t, r, nil)
	require.Error(t, c.Restrict(b.queue, "", 0), "a reason is required")
	require.Error(t, c.Restrict(b.queue, "breaker", -1))
	require.Error(t, c.Restrict("nope", "breaker", 0))

	require.NoError(t, c.Restrict(b.queue, "breaker", 1))
	require.Equal(t, 1, c.Concurrency(b.queue), "the restriction's limit applies")
	require.NoError(t, c.SetConcurrency(b.queue, 2))
	require.Equal(t, 1, c.Concurrency(b.queue), "the lower of the two limits applies")
	require.NoError(t, c.Unrestrict(b.queue, "breaker"))
	require.Equal(t, 2, c.Concurrency(b.queue), "the operator's limit stays")

	require.NoError(t, c.Pause(b.queue))
	require.NoError(t, c.Restrict(b.queue, "breaker", 0))
	require.NoError(t, c.Unrestrict(b.queue, "breaker"))
	require.True(t, c.Paused(b.queue), "lifting the breaker's pause keeps the operator's")
	testenv.WaitFor(t, "basic.cancel", func() bool { return consumers(t, b.conn, b.queue) == 0 })

	require.NoError(t, c.Restrict(b.queue, "breaker", 0))
	require.NoError(t, c.Resume(b.queue))
	require.True(t, c.Paused(b.queue), "the operator's resume keeps the breaker's pause")
	b.publish(t, b.queue, `{"id":"r1"}`)
	require.Equal(t, 1, amqptest.Depth(t, b.conn, b.queue), "nothing is taken while restricted")
	require.NoError(t, c.Unrestrict(b.queue, "breaker"))
	require.False(t, c.Paused(b.queue))
	require.Equal(t, inboxtype.ActionAcked, b.rec.next(t).Outcome.Action)
	b.stop(t, c)
}
