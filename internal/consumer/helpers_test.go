package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
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

// order is the test payload: its business identity is ID.
type order struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

func (o order) IdempotencyKey() string { return "order:" + o.ID }

func (o order) Validate() error {
	if o.Amount < 0 {
		return errors.New("amount must not be negative")
	}
	return nil
}

// outcomeRec is one OnOutcome call.
type outcomeRec struct {
	ID      string // the order id (decoded) or the raw body
	Attempt int
	Outcome inboxtype.Outcome
	Headers amqp.Table
}

// recorder is an Observer that forwards outcomes and states to channels.
type recorder struct {
	inboxtype.NopObserver
	outcomes chan outcomeRec
	states   chan inboxtype.ConnState
	inProc   atomic.Int32
}

func (r *recorder) OnInProcessRetry(*inboxtype.Delivery, retry.Decision, time.Duration) {
	r.inProc.Add(1)
}

func newRecorder() *recorder {
	return &recorder{outcomes: make(chan outcomeRec, 1024), states: make(chan inboxtype.ConnState, 64)}
}

func (r *recorder) OnOutcome(d *inboxtype.Delivery, o inboxtype.Outcome) {
	id := string(d.Body)
	if v, ok := d.Value.(*order); ok {
		id = v.ID
	}
	r.outcomes <- outcomeRec{ID: id, Attempt: d.Attempt, Outcome: o, Headers: d.Headers}
}

func (r *recorder) OnConnState(s inboxtype.ConnState, _ error) {
	select {
	case r.states <- s:
	default:
	}
}

// next waits for the next outcome.
func (r *recorder) next(t *testing.T) outcomeRec {
	t.Helper()
	return testenv.WaitChan(t, r.outcomes, "an outcome")
}

// drainStates returns the connection states reported so far and not yet
// read.
func (r *recorder) drainStates() []inboxtype.ConnState {
	var out []inboxtype.ConnState
	for {
		select {
		case s := <-r.states:
			out = append(out, s)
		default:
			return out
		}
	}
}

// waitState waits until the consumer reports state s.
func (r *recorder) waitState(t *testing.T, s inboxtype.ConnState) {
	t.Helper()
	for {
		if testenv.WaitChan(t, r.states, "connection state "+string(s)) == s {
			return
		}
	}
}

// testBundle is one test's broker fixture.
type testBundle struct {
	queue string
	conn  *amqp.Connection
	pub   *amqptest.Publisher
	rec   *recorder
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	conn := amqptest.Dial(t)
	return &testBundle{
		queue: amqptest.QueueName(t),
		conn:  conn,
		pub:   amqptest.NewPublisher(t, conn),
		rec:   newRecorder(),
	}
}

// fastOpts are handler options with short tiers and no in-process retry.
func fastOpts(tiers ...time.Duration) *consumer.HandlerOpts {
	if len(tiers) == 0 {
		tiers = []time.Duration{100 * time.Millisecond, time.Second}
	}
	return &consumer.HandlerOpts{
		Policy:    retry.Exponential{InitialInterval: 50 * time.Millisecond, RandomizationFactor: -1, MaxAttempts: 3},
		InProcess: retry.InProcess{Tries: -1},
		Queue:     consumer.QueueOpts{Concurrency: 2, RetryTiers: tiers},
	}
}

// start builds and starts a consumer for router; Stop runs at cleanup.
func (b *testBundle) start(t *testing.T, router *consumer.Router, mutate func(*consumer.Config)) *consumer.Consumer {
	t.Helper()
	c := b.newConsumer(t, router, mutate)
	require.NoError(t, c.Start(t.Context()))
	return c
}

func (b *testBundle) newConsumer(t *testing.T, router *consumer.Router, mutate func(*consumer.Config)) *consumer.Consumer {
	t.Helper()
	cfg := &consumer.Config{
		URL:                      testenv.AMQPURL(),
		Name:                     "inboxmq-test-" + b.queue,
		Router:                   router,
		Observers:                []inboxtype.Observer{b.rec},
		ReconnectInitialInterval: 20 * time.Millisecond,
		ReconnectMaxInterval:     200 * time.Millisecond,
		SoftStopTimeout:          5 * time.Second,
	}
	if mutate != nil {
		mutate(cfg)
	}
	c, err := consumer.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
		defer cancel()
		_ = c.Stop(ctx)
	})
	return c
}

func (b *testBundle) publish(t *testing.T, queue string, body string) {
	t.Helper()
	b.pub.Publish(queue, []byte(body), amqp.Publishing{MessageId: "m-" + body})
}

func (b *testBundle) stop(t *testing.T, c *consumer.Consumer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
	defer cancel()
	require.NoError(t, c.Stop(ctx))
}

// consumers reports the broker's consumer count of queue.
func consumers(t *testing.T, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	return q.Consumers
}
