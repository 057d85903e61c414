package inboxmq_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// A failed delivery's retry waits in the outbox, not in the broker's
// delay queues: the relay publishes the copy back to the work queue when
// it is due, with the original's message id and the next attempt number,
// and the delay queues stay empty.
func TestWorker_RetryWaitsInTheOutbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	attempts := make(chan int, 4)
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		attempts <- msg.Attempt
		if msg.Attempt == 1 {
			return errors.New("gateway timeout")
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, msg.Body.ID)
		return err
	}, &inboxmq.RouteOpts{
		Retry:     retry.Exponential{InitialInterval: 200 * time.Millisecond, RandomizationFactor: -1, MaxAttempts: 3},
		InProcess: retry.InProcess{Tries: -1},
		Queue:     &inboxmq.QueueOpts{RetryTiers: []time.Duration{time.Second, time.Minute}},
	})
	reg := prometheus.NewRegistry()
	w, err := inboxmq.NewWorker(&inboxmq.Config{URL: testenv.AMQPURL(), DB: b.pool, Routes: routes, Registerer: reg})
	require.NoError(t, err)
	require.NoError(t, w.Start(t.Context()))
	t.Cleanup(func() { _ = w.Stop(context.Background()) })

	b.pub.Publish(b.queue, []byte(`{"id":"r1"}`), amqp.Publishing{MessageId: "m-r1", Timestamp: time.Now()})
	require.Equal(t, 1, testenv.WaitChan(t, attempts, "the first attempt"))
	require.Equal(t, 2, testenv.WaitChan(t, attempts, "the retry"))
	testenv.WaitFor(t, "the effect committed", func() bool { return b.count(t, `SELECT count(*) FROM effects`) == 1 })
	testenv.WaitFor(t, "the retry's row sent", func() bool {
		return b.count(t, `SELECT count(*) FROM inboxmq_outbox WHERE sent_at IS NOT NULL AND routing_key = '`+b.queue+`'
			AND properties->>'message_id' = 'm-r1' AND (headers->'x-attempt') IS NOT NULL`) == 1
	})
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inboxmq_outbox`), "one row: the retry")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inboxmq_outbox WHERE created_at - (SELECT first_seen_at FROM inboxmq_inbox) >= interval '200 milliseconds'`),
		"due the policy's delay after the failure, not a tier's")
	// The job's critical time runs from its publication to its effect:
	// the retry's delay is part of it.
	testenv.WaitFor(t, "the job's critical time observed", func() bool {
		h := histogram(t, reg, "inboxmq_critical_time_seconds")
		return h != nil && h.GetSampleCount() == 1
	})
	require.GreaterOrEqual(t, histogram(t, reg, "inboxmq_critical_time_seconds").GetSampleSum(), 0.2)
	require.NoError(t, w.Stop(t.Context()))
	for _, tier := range []time.Duration{time.Second, time.Minute} {
		require.Equal(t, 0, amqptest.Depth(t, b.conn, inboxtype.RetryQueue(b.queue, tier)), "nothing went through the delay queues")
	}
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue))
}

// histogram returns the one histogram of the metric name in reg, nil if
// it has no sample yet.
func histogram(t *testing.T, reg *prometheus.Registry, name string) *dto.Histogram {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetHistogram()
		}
	}
	return nil
}

// A run that asks for a delay (a downstream's 429 for one tenant) defers
// that tenant's other deliveries without running them and without an
// attempt, while another tenant's run at once; the deferred ones run once
// the delay has passed.
func TestWorker_TenantDeferral(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ran := make(chan string, 16)
	var limited atomic.Bool
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		ran <- msg.Body.ID
		if msg.Body.ID == "acme-1" && limited.CompareAndSwap(false, true) {
			return retry.After(time.Second, errors.New("HTTP 429 Too Many Requests"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, msg.Body.ID)
		return err
	}, &inboxmq.RouteOpts{
		Concurrency: 1,
		InProcess:   retry.InProcess{Tries: -1},
		Tenant:      func(d *inboxtype.Delivery) string { s, _ := d.Raw.Headers["tenant"].(string); return s },
	})
	reg := prometheus.NewRegistry()
	w, err := inboxmq.NewWorker(&inboxmq.Config{URL: testenv.AMQPURL(), DB: b.pool, Routes: routes, Registerer: reg})
	require.NoError(t, err)
	require.NoError(t, w.Start(t.Context()))
	t.Cleanup(func() { _ = w.Stop(context.Background()) })

	send := func(id, tenant string) {
		b.pub.Publish(b.queue, fmt.Appendf(nil, `{"id":%q}`, id), amqp.Publishing{MessageId: id, Headers: amqp.Table{"tenant": tenant}})
	}
	send("acme-1", "acme")
	require.Equal(t, "acme-1", testenv.WaitChan(t, ran, "the run that gets the 429"))
	send("acme-2", "acme")
	send("globex-1", "globex")
	require.Equal(t, "globex-1", testenv.WaitChan(t, ran, "the other tenant's run"),
		"acme-2 did not run while acme is deferred")
	testenv.WaitFor(t, "acme-2 deferred, uncounted", func() bool {
		return sumByLabel(t, reg, "reason", "key_deferred") == 1 // job_retry_total: the other reasons' series stay 0
	})
	testenv.WaitFor(t, "every effect once the delay passed", func() bool {
		return b.count(t, `SELECT count(*) FROM effects`) == 3
	})
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE id = 'acme-2'`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE key = 'order:acme-2' AND attempts = 1`), "no attempt spent")
}
