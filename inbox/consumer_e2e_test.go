package inbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// These tests drive the inbox through the real consumer and broker: the
// retry and dead-letter paths of issue "Retries and dead letters" end to end.

// outcomes records the consumer's outcomes in order.
type outcomes struct {
	inboxtype.NopObserver
	ch chan inboxtype.Outcome
}

func (o *outcomes) OnOutcome(_ *inboxtype.Delivery, out inboxtype.Outcome) { o.ch <- out }

func (o *outcomes) next(t *testing.T) inboxtype.Outcome {
	t.Helper()
	select {
	case out := <-o.ch:
		return out
	case <-time.After(testenv.Timeout()):
		t.Fatal("timed out waiting for an outcome")
		return inboxtype.Outcome{}
	}
}

type e2e struct {
	*testBundle
	queue string
	conn  *amqp.Connection
	pub   *amqptest.Publisher
	obs   *outcomes
}

func setupE2E(t *testing.T) *e2e {
	t.Helper()
	conn := amqptest.Dial(t)
	return &e2e{
		testBundle: setup(t, nil),
		queue:      amqptest.QueueName(t),
		conn:       conn,
		pub:        amqptest.NewPublisher(t, conn),
		obs:        &outcomes{ch: make(chan inboxtype.Outcome, 64)},
	}
}

func (b *e2e) start(t *testing.T, h inboxtype.Handler[order], policy retry.Policy) {
	t.Helper()
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, h, &consumer.HandlerOpts{
		Namespace: "payments",
		Policy:    policy,
		InProcess: retry.InProcess{Tries: -1}, // every retry goes through the broker here
		Queue:     consumer.QueueOpts{Concurrency: 2, RetryTiers: []time.Duration{50 * time.Millisecond, time.Second}},
	})
	c, err := consumer.New(&consumer.Config{URL: testenv.AMQPURL(), Router: r, Observers: []inboxtype.Observer{b.obs}})
	require.NoError(t, err)
	require.NoError(t, c.Start(t.Context()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
	})
}

// A transient database error (a serialization failure injected N times) is
// retried through the broker with the same key and growing attempts, and
// ends in exactly one effect.
func TestE2E_TransientDBErrorRetriedToOneEffect(t *testing.T) {
	t.Parallel()
	b := setupE2E(t)
	const injected = 2
	var calls atomic.Int64
	attempts := make(chan int, 8)
	b.start(t, inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, m *inboxtype.Message[order]) error {
		attempts <- m.Attempt
		if calls.Add(1) <= injected {
			_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40001'; END $$`)
			return err
		}
		return effectHandler(nil)(ctx, tx, m)
	}, nil), retry.Exponential{InitialInterval: 10 * time.Millisecond, MaxAttempts: 5})
	b.pub.Publish(b.queue, []byte(`{"order_id":"t1","amount":5}`), amqp.Publishing{MessageId: "m1"})

	for i := 1; i <= injected; i++ {
		out := b.obs.next(t)
		require.Equal(t, inboxtype.ActionRetried, out.Action)
		require.Equal(t, inbox.ReasonDBSerialization, out.Decision.Reason)
		require.Equal(t, i, <-attempts)
	}
	require.Equal(t, inboxtype.ActionAcked, b.obs.next(t).Action)
	require.Equal(t, injected+1, <-attempts)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:t1'`))
	rec := b.get(t, "payments", "order:t1")
	require.Equal(t, inbox.RecordCompleted, rec.Status)
	require.Equal(t, injected+1, rec.Attempts, "every attempt is on the row, under the same key")
}

// The crash window between the retry copy's confirm and the original's ack:
// both the original (redelivered) and the retry copy arrive. The inbox
// absorbs the second: one effect, one duplicate.
func TestE2E_RetryCopyAndRedeliveredOriginalAreAbsorbed(t *testing.T) {
	t.Parallel()
	b := setupE2E(t)
	b.start(t, inbox.Handler(b.store, effectHandler(nil), nil), nil)
	body := []byte(`{"order_id":"w1","amount":5}`)
	// What the broker holds after the crash: the retry copy (attempt 2, from
	// the wait queue) and the un-acked original, redelivered.
	b.pub.Publish(b.queue, body, amqp.Publishing{MessageId: "m1", Headers: amqp.Table{inboxtype.HeaderAttempt: int32(2)}})
	b.pub.Publish(b.queue, body, amqp.Publishing{MessageId: "m1"})

	got := map[retry.Kind]int{}
	for range 2 {
		out := b.obs.next(t)
		require.Equal(t, inboxtype.ActionAcked, out.Action)
		got[out.Decision.Kind]++
	}
	require.Equal(t, map[retry.Kind]int{retry.KindSucceeded: 1, retry.KindDuplicate: 1}, got)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:w1'`))
}

// Replay from the DLQ goes through the same inbox: a dead-lettered (failed)
// message is processed once when replayed; replaying a completed one is a
// counted duplicate and writes nothing.
func TestE2E_ReplayFailedOnceAndCompletedAsDuplicate(t *testing.T) {
	t.Parallel()
	b := setupE2E(t)
	var gatewayDown atomic.Bool
	gatewayDown.Store(true)
	b.start(t, inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, m *inboxtype.Message[order]) error {
		if gatewayDown.Load() {
			return retry.Permanent(errors.New("gateway refused"))
		}
		return effectHandler(nil)(ctx, tx, m)
	}, nil), nil)
	b.pub.Publish(b.queue, []byte(`{"order_id":"r1","amount":5}`), amqp.Publishing{MessageId: "m1"})
	require.Equal(t, inboxtype.ActionDeadLettered, b.obs.next(t).Action)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, inbox.RecordFailed, b.get(t, "payments", "order:r1").Status)

	// The operator fixes the cause and replays: processed once.
	gatewayDown.Store(false)
	res, err := consumer.ReplayDLQ(t.Context(), b.conn, b.queue, nil)
	require.NoError(t, err)
	require.Equal(t, 1, res.Replayed)
	require.Equal(t, inboxtype.ActionAcked, b.obs.next(t).Action)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:r1'`))

	// A copy of the completed message lands in the DLQ (say a producer resent
	// it while a poison rule was active) and is replayed: a duplicate.
	b.pub.Publish(b.queue+".dlq", []byte(`{"order_id":"r1","amount":5}`), amqp.Publishing{MessageId: "m2",
		Headers: amqp.Table{inboxtype.HeaderError: "permanent: resent", inboxtype.HeaderIdempotencyKey: "order:r1"}})
	res, err = consumer.ReplayDLQ(t.Context(), b.conn, b.queue, &consumer.ReplayOpts{Key: "order:r1"})
	require.NoError(t, err)
	require.Equal(t, 1, res.Replayed)
	out := b.obs.next(t)
	require.Equal(t, inboxtype.ActionAcked, out.Action)
	require.Equal(t, retry.KindDuplicate, out.Decision.Kind)
	require.Equal(t, retry.SourceInbox, out.Decision.Source)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:r1'`), "no second effect")
}
