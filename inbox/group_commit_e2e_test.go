package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
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

// A worker that loses its broker connection after a group commit's COMMIT
// and before the batch's (coalesced) acks: every delivery of the batch is
// redelivered, found completed and acked as a duplicate — one effect per
// key, none lost, nothing left in the queue. In transactional mode, and in
// claim mode with group-committed completions.
func TestE2E_GroupCommitConnectionLostBetweenCommitAndAck(t *testing.T) {
	t.Parallel()
	const n = 8
	group := &inbox.GroupCommit{MaxBatch: n, MaxWait: time.Minute, MaxInFlight: 1}
	t.Run("transactional", func(t *testing.T) {
		t.Parallel()
		b := setupE2E(t)
		connectionLostBetweenCommitAndAck(t, b, n, inbox.Handler(b.store, effectHandler(nil), group))
	})
	t.Run("claim", func(t *testing.T) {
		t.Parallel()
		b := setupE2E(t)
		h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
			return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error { return effectHandler(nil)(ctx, tx, msg) })
		}, group, nil)
		connectionLostBetweenCommitAndAck(t, b, n, h)
	})
}

// connectionLostBetweenCommitAndAck runs h, whose batches hold n
// deliveries, through the crash between commit and ack.
func connectionLostBetweenCommitAndAck(t *testing.T, b *e2e, n int, h inboxtype.Handler[order]) {
	name := "inboxmq-test-" + b.queue
	var crash sync.Once
	afterCommit := func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
		return func(ctx context.Context, d *inboxtype.Delivery) error {
			err := next(ctx, d)
			if err == nil {
				// The batch is committed; kill the connection before any of
				// its deliveries is acked (the others wait here for it).
				crash.Do(func() { amqptest.CloseConnection(t, name) })
			}
			return err
		}
	}
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, h, &consumer.HandlerOpts{
		Namespace:  "payments",
		Middleware: []inboxtype.Middleware{afterCommit},
		InProcess:  retry.InProcess{Tries: -1},
		Queue:      consumer.QueueOpts{Concurrency: 2 * n},
	})
	obs := &outcomes{ch: make(chan inboxtype.Outcome, 4*n)}
	c, err := consumer.New(&consumer.Config{
		URL: testenv.AMQPURL(), Name: name, Router: r, Observers: []inboxtype.Observer{obs},
		ReconnectInitialInterval: 20 * time.Millisecond, ReconnectMaxInterval: 200 * time.Millisecond,
	})
	require.NoError(t, err)
	require.NoError(t, c.Start(t.Context()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
		defer cancel()
		_ = c.Stop(ctx)
	})
	for i := range n {
		body, err := json.Marshal(order{OrderID: fmt.Sprint(i), Amount: 1})
		require.NoError(t, err)
		b.pub.Publish(b.queue, body, amqp.Publishing{MessageId: fmt.Sprintf("m-%d", i)})
	}

	abandoned, duplicates := 0, 0
	for abandoned < n || duplicates < n {
		out := obs.next(t)
		switch {
		case out.Action == inboxtype.ActionAbandoned:
			abandoned++
		case out.Action == inboxtype.ActionAcked && out.Decision.Kind == retry.KindDuplicate:
			duplicates++
		default:
			t.Fatalf("unexpected outcome %+v", out)
		}
	}
	require.Equal(t, n, b.count(t, `SELECT count(*) FROM effects`), "one effect per key")
	require.Equal(t, n, b.count(t, `SELECT count(DISTINCT key) FROM effects`))
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
	defer cancel()
	require.NoError(t, c.Stop(ctx))
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue), "every redelivery acked")
}
