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

// startWith starts a consumer of b.queue with handler h, in-process tries
// and the given observers before the test's own.
func (b *e2e) startWith(t *testing.T, h inboxtype.Handler[order], policy retry.Policy, inProcess retry.InProcess, observers ...inboxtype.Observer) {
	t.Helper()
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, h, &consumer.HandlerOpts{
		Namespace: "payments",
		Policy:    policy,
		InProcess: inProcess,
		Queue:     consumer.QueueOpts{Concurrency: 1, RetryTiers: []time.Duration{20 * time.Millisecond}},
	})
	c, err := consumer.New(&consumer.Config{URL: testenv.AMQPURL(), Router: r, Observers: append(observers, b.obs)})
	require.NoError(t, err)
	require.NoError(t, c.Start(t.Context()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
	})
}

// waitDeadLetter waits for the consumer's dead-letter outcome and returns
// the copy in the DLQ.
func (b *e2e) waitDeadLetter(t *testing.T) amqp.Delivery {
	t.Helper()
	for {
		out := b.obs.next(t)
		if out.Action == inboxtype.ActionDeadLettered {
			break
		}
		require.Equal(t, inboxtype.ActionRetried, out.Action, "%+v", out)
	}
	dead, ok := amqptest.Get(t, b.conn, b.queue+".dlq")
	require.True(t, ok, "the dead letter is in the DLQ")
	return dead
}

// The row's attempts is the broker attempt of the last delivery that took
// the key up: a job that always fails, retried in process and through the
// broker up to the policy's bound, ends with the same number on its row as
// on its dead-letter copy (x-attempt), not the count of handler runs — in
// transactional and in claim mode. With the store's DeadLetterObserver the
// row is dead with the copy's x-error.
func TestE2E_RowAttemptsMatchDeadLetterCopy(t *testing.T) {
	t.Parallel()
	// gateway fails until it is up, counting its calls.
	type gateway struct{ runs, up atomic.Int64 }
	call := func(g *gateway) error {
		g.runs.Add(1)
		if g.up.Load() == 0 {
			return errors.New("gateway down")
		}
		return nil
	}
	for _, tc := range []struct {
		name string
		h    func(s *inbox.Store, g *gateway) inboxtype.Handler[order]
	}{
		{"transactional", func(s *inbox.Store, g *gateway) inboxtype.Handler[order] {
			return inbox.Handler(s, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
				if err := call(g); err != nil {
					return err
				}
				return effectHandler(nil)(ctx, tx, msg)
			}, nil)
		}},
		{"claim", func(s *inbox.Store, g *gateway) inboxtype.Handler[order] {
			return inbox.ClaimHandler(s, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
				if err := call(g); err != nil {
					return err
				}
				return c.Complete(ctx, completeWithEffect(msg))
			}, nil, nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupE2E(t)
			const maxAttempts, inProcessTries = 3, 2
			g := &gateway{}
			b.startWith(t, tc.h(b.store, g), retry.Exponential{InitialInterval: time.Millisecond, MaxAttempts: maxAttempts},
				retry.InProcess{Tries: inProcessTries, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond},
				b.store.DeadLetterObserver())
			b.pub.Publish(b.queue, []byte(`{"order_id":"a1","amount":5}`), amqp.Publishing{MessageId: "m1"})

			dead := b.waitDeadLetter(t)
			require.Equal(t, int64(maxAttempts*(1+inProcessTries)), g.runs.Load(), "every broker attempt ran in process too")
			require.Equal(t, maxAttempts, inboxtype.HeaderInt(dead.Headers, inboxtype.HeaderAttempt))
			r := b.get(t, "payments", "order:a1")
			require.Equal(t, maxAttempts, r.Attempts, "the row says what the DLQ copy says")
			require.Equal(t, inbox.RecordDead, r.Status, "dead-lettered, so dead")
			require.Equal(t, dead.Headers[inboxtype.HeaderError], *r.LastError, "with the copy's x-error")

			// The gateway is back; the replay takes the dead key up again.
			g.up.Store(1)
			b.pub.Publish(b.queue+".dlq", dead.Body, amqp.Publishing{MessageId: dead.MessageId, Headers: dead.Headers})
			res, err := consumer.ReplayDLQ(t.Context(), b.conn, b.queue, nil)
			require.NoError(t, err)
			require.Equal(t, 1, res.Replayed)
			require.Equal(t, inboxtype.ActionAcked, b.obs.next(t).Action)
			r = b.get(t, "payments", "order:a1")
			require.Equal(t, inbox.RecordCompleted, r.Status)
			require.Equal(t, 1, r.Attempts, "a replay starts again at attempt 1")
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:a1'`))
		})
	}
}
