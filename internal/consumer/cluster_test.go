package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
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

// nodeLog records OnBrokerNode calls as "role node open|closed".
type nodeLog struct {
	mu     sync.Mutex
	events []string
}

func (l *nodeLog) hook(role, node string, connected bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	state := "closed"
	if connected {
		state = "open"
	}
	l.events = append(l.events, role+" "+node+" "+state)
}

func (l *nodeLog) has(event string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.events {
		if e == event {
			return true
		}
	}
	return false
}

// hostPort is the host:port of a broker URL, as the consumer reports it.
func hostPort(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	if u.Port() == "" {
		return u.Hostname() + ":5672"
	}
	return u.Host
}

// Config.URL lists a node that is down before the live one: the consumer
// and its publisher connect to the live node, consume and settle (an ack
// and a dead letter through the publisher), and report the node.
func TestConsumer_ClusterURLSkipsADeadNode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live := testenv.AMQPURL()
	log, rec := logtest.New(slog.LevelInfo)
	var nodes nodeLog
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		if m.Body.ID == "bad" {
			return retry.Permanent(fmt.Errorf("refused"))
		}
		return nil
	}), fastOpts())
	c := b.start(t, r, func(cfg *consumer.Config) {
		cfg.URL = amqptest.DeadURL(t) + ", " + live
		cfg.Logger = log
		cfg.OnBrokerNode = nodes.hook
	})
	b.publish(t, b.queue, `{"id":"ok"}`)
	b.publish(t, b.queue, `{"id":"bad"}`)
	actions := map[string]inboxtype.Action{}
	for range 2 {
		o := b.rec.next(t)
		actions[o.ID] = o.Outcome.Action
	}
	require.Equal(t, map[string]inboxtype.Action{"ok": inboxtype.ActionAcked, "bad": inboxtype.ActionDeadLettered}, actions)
	b.stop(t, c)
	require.Equal(t, 1, amqptest.Depth(t, b.conn, b.queue+".dlq"), "the publisher connection reached the live node")
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue))

	node := hostPort(t, live)
	require.True(t, nodes.has("consumer "+node+" open"))
	require.True(t, nodes.has("publisher "+node+" open"))
	testenv.WaitFor(t, "the closes reported", func() bool {
		return nodes.has("consumer "+node+" closed") && nodes.has("publisher "+node+" closed")
	})
	connected := rec.Message("broker connection opened")
	require.NotEmpty(t, connected)
	for _, e := range connected {
		require.Equal(t, node, e.Attrs["node"])
		require.Equal(t, "inboxmq-test-"+b.queue, e.Attrs["worker"])
	}
	require.NotEmpty(t, rec.Message("broker node unreachable"), "the dead node was tried and logged")
}

// A connection closed by the broker (a node going away) is re-established
// on another node of the list without a restart; the log names both nodes,
// and deliveries of the lost channel are redelivered, never acked on the
// new one.
func TestConsumer_FailsOverToAnotherNode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, other := testenv.AMQPURL(), amqptest.AliasURL(t)
	log, rec := logtest.New(slog.LevelInfo)
	var nodes nodeLog
	gate, reached := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r := consumer.NewRouter()
	opts := fastOpts()
	opts.Queue.Concurrency = 1
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		if m.Body.ID == "held" {
			once.Do(func() {
				close(reached)
				<-gate
			})
		}
		return nil
	}), opts)
	c := b.start(t, r, func(cfg *consumer.Config) {
		cfg.URL = a + "," + other
		cfg.Logger = log
		cfg.OnBrokerNode = nodes.hook
	})
	b.rec.waitState(t, inboxtype.ConnConnected)
	first := rec.Message("broker connection opened")
	require.NotEmpty(t, first)
	var before string
	for _, e := range first {
		if e.Attrs["role"] == "consumer" {
			before, _ = e.Attrs["node"].(string)
		}
	}
	require.NotEmpty(t, before)

	b.publish(t, b.queue, `{"id":"held"}`)
	testenv.WaitChan(t, reached, "the held handler")
	amqptest.CloseConnection(t, "inboxmq-test-"+b.queue)
	b.rec.waitState(t, inboxtype.ConnDisconnected)
	close(gate)
	// The held delivery's ack goes to its lost channel and fails: it is
	// abandoned there and redelivered on the new connection.
	o := b.rec.next(t)
	require.Equal(t, "held", o.ID)
	require.Equal(t, inboxtype.ActionAbandoned, o.Outcome.Action)
	b.rec.waitState(t, inboxtype.ConnConnected)
	o = b.rec.next(t)
	require.Equal(t, "held", o.ID)
	require.Equal(t, inboxtype.ActionAcked, o.Outcome.Action)

	failover := rec.Message("broker failover")
	var moved bool
	for _, e := range failover {
		if e.Attrs["role"] == "consumer" {
			require.Equal(t, before, e.Attrs["previous_node"])
			require.NotEqual(t, before, e.Attrs["node"])
			moved = true
		}
	}
	require.True(t, moved, "the consuming connection moved to the other node: %v", failover)
	require.NotEmpty(t, rec.Message("broker connection lost"))
	require.True(t, nodes.has("consumer "+before+" closed"))
	b.stop(t, c)
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue))
}

// A quorum work queue with a quorum DLQ and quorum retry tiers: a message
// retried through a tier comes back to the work queue, one that fails
// permanently lands in the DLQ with x-error.
func TestConsumer_QuorumRetryTierAndDLQRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	calls := map[string]int{}
	r := consumer.NewRouter()
	opts := fastOpts(100*time.Millisecond, time.Second)
	opts.Queue.Type, opts.Queue.DeliveryLimit = consumer.Quorum, 5
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		mu.Lock()
		calls[m.Body.ID]++
		n := calls[m.Body.ID]
		mu.Unlock()
		switch {
		case m.Body.ID == "poison":
			return retry.Permanent(fmt.Errorf("card refused"))
		case n == 1:
			return retry.After(50*time.Millisecond, fmt.Errorf("gateway busy"))
		}
		return nil
	}), opts)
	c := b.start(t, r, nil)
	b.publish(t, b.queue, `{"id":"later"}`)
	b.publish(t, b.queue, `{"id":"poison"}`)

	var later []outcomeRec
	var poison outcomeRec
	for len(later) < 2 || poison.ID == "" {
		o := b.rec.next(t)
		if o.ID == "poison" {
			poison = o
			continue
		}
		later = append(later, o)
	}
	b.stop(t, c)
	require.Equal(t, inboxtype.ActionRetried, later[0].Outcome.Action)
	require.Equal(t, inboxtype.ActionAcked, later[1].Outcome.Action, "the copy came back through the quorum tier")
	require.Equal(t, 2, later[1].Attempt)
	require.Equal(t, inboxtype.ActionDeadLettered, poison.Outcome.Action)

	dead := amqptest.Drain(t, b.conn, b.queue+".dlq")
	require.Len(t, dead, 1)
	require.JSONEq(t, `{"id":"poison"}`, string(dead[0].Body))
	require.Contains(t, dead[0].Headers[inboxtype.HeaderError], "card refused")
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue))
	require.Equal(t, 0, amqptest.Depth(t, b.conn, inboxtype.RetryQueue(b.queue, 100*time.Millisecond)))
	// The tier is a quorum queue: redeclaring it as one succeeds.
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	_, err = ch.QueueDeclarePassive(inboxtype.RetryQueue(b.queue, 100*time.Millisecond), true, false, false, false, nil)
	require.NoError(t, err)
	_, err = ch.QueueDeclare(b.queue+".dlq", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	require.NoError(t, err, "the DLQ is a quorum queue")
}

// A route configured as quorum whose queues already exist as classic
// (declared by an older worker) keeps them as classic, warns with the
// migration, and consumes; and the reverse.
func TestConsumer_ExistingQueueTypeIsKept(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ existing, configured consumer.QueueType }{
		{consumer.Classic, consumer.Quorum},
		{consumer.Quorum, consumer.Classic},
	} {
		t.Run(string(tc.existing)+" kept", func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			handler := inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error { return nil })
			old := consumer.NewRouter()
			opts := fastOpts()
			opts.Queue.Type = tc.existing
			consumer.Register(old, b.queue, handler, opts)
			b.stop(t, b.start(t, old, nil))

			log, rec := logtest.New(slog.LevelWarn)
			r := consumer.NewRouter()
			opts = fastOpts()
			opts.Queue.Type = tc.configured
			consumer.Register(r, b.queue, handler, opts)
			c := b.start(t, r, func(cfg *consumer.Config) { cfg.Logger = log })
			b.publish(t, b.queue, `{"id":"1"}`)
			require.Equal(t, inboxtype.ActionAcked, b.rec.next(t).Outcome.Action)
			b.stop(t, c)

			warned := rec.Containing("exists with another type than configured")
			require.Len(t, warned, 1)
			require.Equal(t, string(tc.existing), warned[0].Attrs["existing_type"])
			require.Equal(t, string(tc.configured), warned[0].Attrs["configured_type"])
			require.Equal(t, b.queue, warned[0].Attrs["queue"])
			// The queue still has its old type.
			ch, err := b.conn.Channel()
			require.NoError(t, err)
			defer ch.Close()
			_, err = ch.QueueDeclare(b.queue+".dlq", true, false, false, false, amqp.Table{"x-queue-type": string(tc.existing)})
			require.NoError(t, err)
		})
	}
}

// A topology of mixed types (a quorum DLQ beside a classic work queue)
// cannot be kept either way: Start fails with an error that names the
// argument and the migration.
func TestConsumer_MixedQueueTypesAreAClearError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(b.queue+".dlq", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	require.NoError(t, err)
	_, err = ch.QueueDeclare(b.queue, true, false, false, false, amqp.Table{"x-queue-type": "classic"})
	require.NoError(t, err)
	require.NoError(t, ch.Close())

	r := consumer.NewRouter()
	opts := fastOpts()
	opts.Queue.Type = consumer.Quorum
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error { return nil }), opts)
	c := b.newConsumer(t, r, nil)
	err = c.Start(t.Context())
	require.Error(t, err)
	require.Contains(t, err.Error(), `"`+b.queue+`.dlq"`)
	require.Contains(t, err.Error(), "x-queue-type")
	require.Contains(t, err.Error(), "Changing a queue's type")
	require.False(t, c.Ready())
}

// A classic work queue of the pre-v0.1.0 shape (no dead-letter route), met
// by a Quorum route, is kept as a classic queue with both warnings.
func TestConsumer_LegacyClassicQueueKeptForAQuorumRoute(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(b.queue, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.Close())

	log, rec := logtest.New(slog.LevelWarn)
	r := consumer.NewRouter()
	opts := fastOpts()
	opts.Queue.Type = consumer.Quorum
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error { return nil }), opts)
	c := b.start(t, r, func(cfg *consumer.Config) { cfg.Logger = log })
	b.publish(t, b.queue, `{"id":"1"}`)
	require.Equal(t, inboxtype.ActionAcked, b.rec.next(t).Outcome.Action)
	b.stop(t, c)
	require.Len(t, rec.Containing("exists with another type than configured"), 1)
	require.Len(t, rec.Containing("declared before v0.1.0"), 1)
}

// A quorum queue's consumer cancelled by the broker (the queue deleted;
// a node that loses the queue does the same) declares the queue again and
// consumes without a restart.
func TestConsumer_QuorumBrokerCancelResumes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := consumer.NewRouter()
	opts := fastOpts()
	opts.Queue.Type = consumer.Quorum
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error {
		return nil
	}), opts)
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

// Dial connects a program's own connection the consumer's way: to a node
// of the list that answers, reported as host:port; a bad list is an error
// without the password.
func TestDial_NodeList(t *testing.T) {
	t.Parallel()
	live := testenv.AMQPURL()
	conn, node, err := consumer.Dial(t.Context(), amqptest.DeadURL(t)+","+live, &consumer.DialOpts{Name: "inboxmq-test " + t.Name()})
	if err != nil {
		testenv.Unavailable(t, "RabbitMQ", err)
	}
	require.Equal(t, hostPort(t, live), node)
	require.NoError(t, conn.Close())

	_, _, err = consumer.Dial(t.Context(), "amqp://u:s3cret@h1/,amqp//u:s3cret@h2/", nil)
	require.ErrorContains(t, err, "has a comma or @ after its host")
	require.NotContains(t, err.Error(), "s3cret")
}
