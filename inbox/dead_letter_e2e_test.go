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

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// startWith starts a consumer of b.queue with handler h, in-process tries
// and the given observers before the test's own.
func (b *e2e) startWith(t *testing.T, h consumer.Handler[order], policy retry.Policy, inProcess retry.InProcess, observers ...consumer.Observer) {
	t.Helper()
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, h, &consumer.HandlerOpts{
		Consumer:  "payments",
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
		if out.Action == consumer.ActionDeadLettered {
			break
		}
		require.Equal(t, consumer.ActionRetried, out.Action, "%+v", out)
	}
	dead, ok := amqptest.Get(t, b.conn, b.queue+".dlq")
	require.True(t, ok, "the dead letter is in the DLQ")
	return dead
}

// The row's attempts is the broker attempt of the last delivery that took
// the key up: a job that always fails, retried in process and through the
// broker up to the policy's bound, ends with the same number on its row as
// on its dead-letter copy (x-attempt), not the count of handler runs — in
// transactional and in claim mode.
func TestE2E_RowAttemptsMatchDeadLetterCopy(t *testing.T) {
	t.Parallel()
	fail := func(runs *atomic.Int64) error {
		runs.Add(1)
		return errors.New("gateway down")
	}
	for _, tc := range []struct {
		name string
		h    func(s *inbox.Store, runs *atomic.Int64) consumer.Handler[order]
	}{
		{"transactional", func(s *inbox.Store, runs *atomic.Int64) consumer.Handler[order] {
			return inbox.Handler(s, func(context.Context, pgx.Tx, *consumer.Message[order]) error { return fail(runs) }, nil)
		}},
		{"claim", func(s *inbox.Store, runs *atomic.Int64) consumer.Handler[order] {
			return inbox.ClaimHandler(s, func(context.Context, *inbox.Claim, *consumer.Message[order]) error { return fail(runs) }, nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupE2E(t)
			const maxAttempts, inProcessTries = 3, 2
			var runs atomic.Int64
			b.startWith(t, tc.h(b.store, &runs), retry.Exponential{InitialInterval: time.Millisecond, MaxAttempts: maxAttempts},
				retry.InProcess{Tries: inProcessTries, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond})
			b.pub.Publish(b.queue, []byte(`{"order_id":"a1","amount":5}`), amqp.Publishing{MessageId: "m1"})

			dead := b.waitDeadLetter(t)
			require.Equal(t, int64(maxAttempts*(1+inProcessTries)), runs.Load(), "every broker attempt ran in process too")
			require.Equal(t, maxAttempts, consumer.HeaderInt(dead.Headers, consumer.HeaderAttempt))
			require.Equal(t, maxAttempts, b.get(t, "payments", "order:a1").Attempts, "the row says what the DLQ copy says")
		})
	}
}
