package inboxmq_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// A key dead-lettered, then delivered anew (a new message id, the same
// job): the route's reuse policy decides — run it again, reject it to the
// DLQ, or attach it to the stored outcome — and a replay from the DLQ runs
// under every policy.
func TestWorker_ReusePolicyAfterDead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	rq, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	replies, err := ch.Consume(rq.Name, "", true, true, false, false, nil)
	require.NoError(t, err)

	routes := inboxmq.NewRoutes()
	queues := map[inboxmq.ReusePolicy]string{}
	ran := make(chan string, 32)
	for _, p := range []inboxmq.ReusePolicy{inboxmq.ReuseRun, inboxmq.ReuseReject, inboxmq.ReuseAttach} {
		q := amqptest.QueueName(t)
		queues[p] = q
		inboxmq.HandleTx(routes, q, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
			ran <- string(p) + " " + msg.Delivery.MessageID
			if msg.Delivery.MessageID == "first" {
				return retry.Permanent(errors.New("card declined"))
			}
			_, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, q)
			return err
		}, &inboxmq.RouteOpts{AfterDead: p, Reply: true})
	}
	w, err := inboxmq.NewWorker(&inboxmq.Config{URL: testenv.AMQPURL(), DB: b.pool, Routes: routes})
	require.NoError(t, err)
	require.NoError(t, w.Start(t.Context()))
	t.Cleanup(func() { _ = w.Stop(context.Background()) })

	send := func(q, id string, h amqp.Table) {
		b.pub.Publish(q, []byte(`{"id":"k"}`), amqp.Publishing{MessageId: id, Headers: h, ReplyTo: rq.Name, CorrelationId: id})
	}
	status := func(q string) (st, lastErr string) {
		_ = b.pool.QueryRow(t.Context(), `SELECT status, coalesce(last_error, '') FROM inboxmq_inbox WHERE consumer = $1 AND key = 'order:k'`, q).Scan(&st, &lastErr)
		return st, lastErr
	}
	for p, q := range queues {
		send(q, "first", nil)
		testenv.WaitFor(t, string(p)+": the key dead", func() bool { st, _ := status(q); return st == "dead" })
		require.Len(t, amqptest.Drain(t, b.conn, q+".dlq"), 1)
	}
	for len(ran) > 0 {
		<-ran
	}

	// run: the new delivery runs and commits.
	send(queues[inboxmq.ReuseRun], "again", nil)
	require.Equal(t, "run again", testenv.WaitChan(t, ran, "the run"))
	testenv.WaitFor(t, "run: completed", func() bool { st, _ := status(queues[inboxmq.ReuseRun]); return st == "completed" })

	// reject: to the DLQ with key_dead, not run; the row keeps its error.
	q := queues[inboxmq.ReuseReject]
	send(q, "again", nil)
	testenv.WaitFor(t, "reject: the new delivery in the DLQ", func() bool { return amqptest.Depth(t, b.conn, q+".dlq") == 1 })
	dead := amqptest.Drain(t, b.conn, q+".dlq")
	require.Contains(t, dead[0].Headers[inboxtype.HeaderError], "key_dead: ")
	require.Contains(t, dead[0].Headers[inboxtype.HeaderError], "card declined", "it names what the key died of")
	st, lastErr := status(q)
	require.Equal(t, "dead", st)
	require.Equal(t, "permanent: card declined", lastErr, "the row keeps the error the key died of")

	// attach: acked without running; the request's reply is the stored
	// outcome, marked replayed.
	q = queues[inboxmq.ReuseAttach]
	send(q, "again-attach", nil)
	var r amqp.Delivery
	for r = testenv.WaitChan(t, replies, "the attach reply"); r.CorrelationId != "again-attach"; r = testenv.WaitChan(t, replies, "the attach reply") { //nolint:revive // skip earlier replies
	}
	require.JSONEq(t, `{"error":"permanent: card declined"}`, string(r.Body))
	require.Equal(t, true, r.Headers[inboxtype.HeaderReplayedOutcome])
	testenv.WaitFor(t, "attach: acked", func() bool { return amqptest.Depth(t, b.conn, q) == 0 })
	require.Equal(t, 0, amqptest.Depth(t, b.conn, q+".dlq"))

	// A replay runs under every policy: once for reject and attach.
	for _, p := range []inboxmq.ReusePolicy{inboxmq.ReuseReject, inboxmq.ReuseAttach} {
		send(queues[p], "replayed", amqp.Table{inboxtype.HeaderReplayCount: int64(1)})
		require.Equal(t, string(p)+" replayed", testenv.WaitChan(t, ran, "the replay of "+string(p)))
		testenv.WaitFor(t, string(p)+": completed by the replay", func() bool { st, _ := status(queues[p]); return st == "completed" })
	}
	require.Empty(t, ran, "nothing else ran")
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM effects`), "one effect per route")
}

// A new delivery of a dead key racing its replay, on a route that rejects
// new deliveries: the replay runs once; the new delivery is rejected (it
// read the key dead) or a duplicate (the replay had committed), never a
// second run.
func TestWorker_ReuseRejectRacingAReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ran := make(chan string, 8)
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		ran <- msg.Delivery.MessageID
		if msg.Delivery.MessageID == "first" {
			return retry.Permanent(errors.New("card declined"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, msg.Delivery.MessageID)
		return err
	}, &inboxmq.RouteOpts{AfterDead: inboxmq.ReuseReject, Concurrency: 2})
	w, err := inboxmq.NewWorker(&inboxmq.Config{URL: testenv.AMQPURL(), DB: b.pool, Routes: routes})
	require.NoError(t, err)
	require.NoError(t, w.Start(t.Context()))
	t.Cleanup(func() { _ = w.Stop(context.Background()) })

	b.pub.Publish(b.queue, []byte(`{"id":"k"}`), amqp.Publishing{MessageId: "first"})
	testenv.WaitFor(t, "the key dead", func() bool {
		return b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE key = 'order:k' AND status = 'dead'`) == 1
	})
	require.Len(t, amqptest.Drain(t, b.conn, b.queue+".dlq"), 1)
	require.Equal(t, "first", <-ran)

	b.pub.Publish(b.queue, []byte(`{"id":"k"}`), amqp.Publishing{MessageId: "replayed", Headers: amqp.Table{inboxtype.HeaderReplayCount: int64(1)}})
	b.pub.Publish(b.queue, []byte(`{"id":"k"}`), amqp.Publishing{MessageId: "new"})
	testenv.WaitFor(t, "the replay committed", func() bool { return b.count(t, `SELECT count(*) FROM effects`) == 1 })
	testenv.WaitFor(t, "both settled", func() bool { return amqptest.Depth(t, b.conn, b.queue) == 0 })
	require.NoError(t, w.Stop(t.Context()))
	require.Equal(t, "replayed", <-ran)
	require.Empty(t, ran, "the new delivery never ran")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE id = 'replayed'`))
	for _, d := range amqptest.Drain(t, b.conn, b.queue+".dlq") {
		require.Equal(t, "new", d.MessageId)
		require.Contains(t, d.Headers[inboxtype.HeaderError], "key_dead: ")
	}
}
