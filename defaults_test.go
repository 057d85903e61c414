package inboxmq_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/logtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// A worker written from the README's handler section alone serves: it
// logs through slog.Default(), serves its metrics with the health
// endpoints, runs the reconciler and retention (the window derived from
// the route and said at start), and declares quorum queues. (The controls
// and the presence row: TestWorker_ObeysPauseByDefault.)
//
// Not parallel: it replaces slog's default logger for its run, while the
// parallel tests wait.
func TestWorker_DefaultsServe(t *testing.T) { //nolint:paralleltest // sets slog.Default
	logger, logs := logtest.New(slog.LevelInfo)
	prev := slog.Default()
	slog.SetDefault(logger)
	t.Cleanup(func() { slog.SetDefault(prev) })

	b := setup(t)
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, msg.Body.ID)
		return err
	}, nil)
	// A claim whose worker vanished an hour ago: the reconciler releases it.
	_, err := b.pool.Exec(t.Context(), `INSERT INTO inboxmq_inbox (consumer, key, status, owner, fence, lease_until)
		VALUES ($1, 'order:ghost', 'processing', 'gone-worker', 1, now() - interval '1 hour')`, b.queue)
	require.NoError(t, err)
	addr := freeAddr(t)
	w, err := inboxmq.NewWorker(&inboxmq.Config{URL: testenv.AMQPURL(), DB: b.pool, Routes: routes, Addr: addr})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	require.NoError(t, w.Start(t.Context()))

	b.pub.Publish(b.queue, []byte(`{"id":"o1"}`), amqp.Publishing{MessageId: "m1"})
	testenv.WaitFor(t, "the order is handled", func() bool { return b.count(t, `SELECT count(*) FROM effects`) == 1 })

	// Logs, with no Logger given.
	require.NotEmpty(t, logs.Message("inboxmq worker started"), "logs through slog.Default()")
	retention := logs.Message("inboxmq: retention keeps completed inbox rows for the window")
	require.Len(t, retention, 1, "retention runs, and its window is said at start")
	require.Contains(t, retention[0].Attrs["longest_redelivery_horizon"], b.queue)
	testenv.WaitFor(t, "the delivery's lines", func() bool { return len(logs.Message("delivery completed")) == 1 })

	// The reconciler, with no setting.
	testenv.WaitFor(t, "the reconciler releases the vanished worker's claim", func() bool {
		return b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE key = 'order:ghost' AND status = 'failed'`) == 1
	})

	// Metrics, served at Addr with the health endpoints.
	resp, err := http.Get("http://" + addr + "/metrics") //nolint:noctx // a test's loopback URL
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Contains(t, string(body), `inboxmq_deliveries_received_total{consumer="`+b.queue+`",queue="`+b.queue+`"} 1`)
	require.Contains(t, string(body), "\ngo_goroutines ", "the Go runtime's series")
	require.Contains(t, string(body), "\nprocess_resident_memory_bytes ", "the process's series")
	require.Equal(t, http.StatusOK, httpStatus("http://"+addr+"/readyz"))

	// Quorum queues: only the arguments the worker declared pass the
	// broker's equivalence check.
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	_, err = ch.QueueDeclare(b.queue, true, false, false, false, amqp.Table{
		"x-queue-type": "quorum", "x-delivery-limit": int64(20),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": b.queue + ".dead",
		"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
	})
	require.NoError(t, err, "the work queue is a quorum queue")
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue))
}
