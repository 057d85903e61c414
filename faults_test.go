package inboxmq_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync/atomic"
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

// signalHandler is a slog.Handler that closes a channel at the first
// record with the given message, and counts them all (count may be nil).
type signalHandler struct {
	msg   string
	seen  chan struct{}
	count *atomic.Int64
}

func (h signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h signalHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		if h.count != nil {
			h.count.Add(1)
		}
		select {
		case <-h.seen:
		default:
			close(h.seen)
		}
	}
	return nil
}
func (h signalHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h signalHandler) WithGroup(string) slog.Handler      { return h }

// The crash window between the DLQ copy's confirm and the fault event's
// outbox row: the row cannot be written (its table is gone for a while),
// so the original is requeued, not acked; its redelivery is dead-lettered
// again and writes the event then. Exactly one event goes out, and the
// DLQ holds a copy per attempt: one more than the settlements that failed
// while the table was away (a replay absorbs the extra copies).
func TestWorker_FaultEventWrittenOnceAfterAFailedOutboxWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	failed := make(chan struct{})
	var failures atomic.Int64
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, func(context.Context, pgx.Tx, *inboxtype.Message[order]) error {
		return retry.Permanent(errors.New("declined"))
	}, &inboxmq.RouteOpts{
		Concurrency: 1,
		Faults:      &inboxmq.FaultOpts{Exchange: b.events, RoutingKey: "order.fault", Body: true},
	})
	w, err := inboxmq.NewWorker(&inboxmq.Config{
		URL: testenv.AMQPURL(), DB: b.pool, Routes: routes,
		Logger:    slog.New(signalHandler{msg: "consumer: settlement failed", seen: failed, count: &failures}),
		Exchanges: []string{b.events},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	require.NoError(t, w.Start(t.Context()))
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(b.sink, false, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(b.sink, "order.fault", b.events, false, nil))
	require.NoError(t, ch.Close())

	_, err = b.pool.Exec(t.Context(), `ALTER TABLE inboxmq_outbox RENAME TO inboxmq_outbox_away`)
	require.NoError(t, err)
	b.pub.Publish(b.queue, []byte(`{"id":"p1"}`), amqp.Publishing{MessageId: "m-p1"})
	testenv.WaitChan(t, failed, "the fault event's row could not be written")
	require.Equal(t, 1, amqptest.Depth(t, b.conn, b.queue+".dlq"), "the copy was confirmed first")
	_, err = b.pool.Exec(t.Context(), `ALTER TABLE inboxmq_outbox_away RENAME TO inboxmq_outbox`)
	require.NoError(t, err)

	// The redelivery may have failed again before the table came back:
	// each failed settlement left one more copy.
	testenv.WaitFor(t, "the redelivery is dead-lettered and its event published", func() bool {
		return amqptest.Depth(t, b.conn, b.sink) == 1 && amqptest.Depth(t, b.conn, b.queue) == 0 &&
			amqptest.Depth(t, b.conn, b.queue+".dlq") == int(failures.Load())+1
	})
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inboxmq_outbox`), "one event row")
	ev, ok := amqptest.Get(t, b.conn, b.sink)
	require.True(t, ok)
	var fe inboxmq.FaultEvent
	require.NoError(t, json.Unmarshal(ev.Body, &fe))
	require.Equal(t, "order:p1", fe.Key)
	require.Equal(t, "permanent", fe.Reason)
	require.JSONEq(t, `{"id":"p1"}`, string(fe.Body))
	require.Equal(t, fe.ID, ev.Headers[inboxtype.HeaderIdempotencyKey])
	require.NoError(t, w.Stop(context.Background()))
}

// A message the broker dead-letters (it expired unconsumed, or a quorum
// queue's delivery limit ended a crash loop) yields exactly one fault
// event, as a handler's dead letter does: the worker files it into the
// DLQ with the broker's reason and writes the event then.
func TestWorker_BrokerDeadLettersPublishOneFaultEvent(t *testing.T) {
	t.Parallel()
	for _, reason := range []string{"broker_expired", "broker_delivery_limit"} {
		t.Run(reason, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var calls atomic.Int64
			newWorker := func() *inboxmq.Worker {
				routes := inboxmq.NewRoutes()
				inboxmq.HandleTx(routes, b.queue, func(_ context.Context, _ pgx.Tx, m *inboxtype.Message[order]) error {
					calls.Add(1)
					ch, ok := m.Delivery.Raw.Acknowledger.(*amqp.Channel)
					require.True(t, ok)
					_ = ch.Close() // the worker "crashes" on this message: nothing commits or is settled
					return errors.New("crashed")
				}, &inboxmq.RouteOpts{
					Concurrency: 1,
					Queue:       &inboxmq.QueueOpts{Type: inboxmq.Quorum, DeliveryLimit: 2},
					Faults:      &inboxmq.FaultOpts{Exchange: b.events, RoutingKey: "order.fault"},
				})
				w, err := inboxmq.NewWorker(&inboxmq.Config{
					URL: testenv.AMQPURL(), DB: b.pool, Routes: routes,
					Exchanges: []string{b.events},
				})
				require.NoError(t, err)
				t.Cleanup(func() { _ = w.Stop(context.Background()) })
				require.NoError(t, w.Start(t.Context()))
				return w
			}
			w := newWorker()
			ch, err := b.conn.Channel()
			require.NoError(t, err)
			_, err = ch.QueueDeclare(b.sink, false, false, false, false, nil)
			require.NoError(t, err)
			require.NoError(t, ch.QueueBind(b.sink, "order.fault", b.events, false, nil))
			require.NoError(t, ch.Close())

			msg := amqp.Publishing{MessageId: "m-p1"}
			if reason == "broker_expired" {
				// No worker consumes while the message expires.
				require.NoError(t, w.Stop(context.Background()))
				msg.Expiration = "50"
			}
			b.pub.Publish(b.queue, []byte(`{"id":"p1"}`), msg)
			if reason == "broker_expired" {
				testenv.WaitFor(t, "the message expired", func() bool { return amqptest.Depth(t, b.conn, b.queue) == 0 })
				w = newWorker()
			}
			testenv.WaitFor(t, "the dead letter filed and its event published", func() bool {
				return amqptest.Depth(t, b.conn, b.queue+".dlq") == 1 && amqptest.Depth(t, b.conn, b.sink) == 1
			})
			require.NoError(t, w.Stop(context.Background()))
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inboxmq_outbox`), "one event row")
			ev, ok := amqptest.Get(t, b.conn, b.sink)
			require.True(t, ok)
			var fe inboxmq.FaultEvent
			require.NoError(t, json.Unmarshal(ev.Body, &fe))
			require.Equal(t, reason, fe.Reason)
			require.Equal(t, "order:p1", fe.Key)
			require.Equal(t, "m-p1", fe.MessageID)
			require.Equal(t, b.queue, fe.Queue)
			require.Contains(t, fe.Error, "the broker dead-lettered the message")
			require.Equal(t, 0, amqptest.Depth(t, b.conn, b.sink), "exactly one event")
			if reason == "broker_expired" {
				require.Zero(t, calls.Load(), "the handler never ran")
			}
		})
	}
}
