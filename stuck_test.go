package inboxmq_test

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/logtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// A handler that outlives its deadline and ignores the cancellation is
// seen: a log line at error with its key, the handlers_stuck gauge, and,
// as it holds the route's only slot, a failing /healthz check naming the
// queue — long before the consumer's watchdog (StallThreshold, here an
// hour) would. When it returns, all three clear.
func TestWorker_StuckHandlerIsReportedWithItsKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		close(entered)
		<-release // ignores ctx
		return nil
	}, &inboxmq.RouteOpts{Concurrency: 1})
	logger, logs := logtest.New(slog.LevelInfo)
	reg := prometheus.NewRegistry()
	health := startHealthWorker(t, &inboxmq.Config{
		URL: testenv.AMQPURL(), DB: b.pool, Routes: routes, Logger: logger, Registerer: reg,
		HandlerTimeout: 400 * time.Millisecond,
		StallThreshold: time.Hour,
	})
	t.Cleanup(unblock) // before the worker stops
	stuck := func() float64 {
		return gaugeValue(t, reg, "inboxmq_handlers_stuck", "queue", b.queue)
	}
	require.Zero(t, stuck(), "the series exists from the start, at 0")

	b.pub.Publish(b.queue, []byte(`{"id":"slow"}`), amqp.Publishing{MessageId: "m-slow"})
	testenv.WaitChan(t, entered, "the handler runs")
	var h healthBody
	testenv.WaitFor(t, "/healthz to fail on the stuck handler", func() bool {
		h = getHealth(t, "http://"+health+"/healthz")
		return h.Code == http.StatusServiceUnavailable
	})
	require.False(t, h.Checks["handlers"].OK)
	require.Contains(t, h.Checks["handlers"].Error, "all 1 slots of queue "+b.queue)
	require.True(t, h.Checks["consumer"].OK, "the watchdog has not fired: the stuck check did")
	require.Equal(t, 1.0, stuck())
	lines := logs.Containing("ignores cancellation")
	require.Len(t, lines, 1)
	require.Equal(t, slog.LevelError, lines[0].Level)
	require.Equal(t, "order:slow", lines[0].Attrs["idempotency_key"])
	require.Equal(t, "m-slow", lines[0].Attrs["message_id"])

	unblock()
	testenv.WaitFor(t, "/healthz to recover once the handler returned", func() bool {
		return getHealth(t, "http://"+health+"/healthz").Code == http.StatusOK
	})
	require.Zero(t, stuck())
	require.Len(t, logs.Message("stuck handler returned"), 1)
}
