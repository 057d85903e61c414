package middleware_test

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/metrics"
	"github.com/inboxmq/inboxmq/middleware"
	"github.com/inboxmq/inboxmq/retry"
)

func TestMetrics_HandlerDurationWithExemplar(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(reg, nil)
	require.NoError(t, err)
	tb := setupTrace(t)

	chain := inboxtype.Chain(middleware.Tracing(tb.tp, nil), middleware.Metrics(m))
	d := inboxtype.NewDelivery("payments", "payments-svc", "w1", &amqp.Delivery{})
	// Outside a consumer the delivery is settled by hand after each run.
	require.NoError(t, runAndSettle(chain(func(context.Context, *inboxtype.Delivery) error { return nil }), d))
	require.Error(t, runAndSettle(chain(func(context.Context, *inboxtype.Delivery) error { return errors.New("x") }), d))
	require.ErrorIs(t, runAndSettle(chain(func(context.Context, *inboxtype.Delivery) error {
		return retry.Duplicate(retry.SourceInbox, nil)
	}), d), retry.ErrDuplicate)

	mfs, err := reg.Gather()
	require.NoError(t, err)
	counts := map[string]uint64{}
	var exemplars int
	for _, mf := range mfs {
		if mf.GetName() != "inboxmq_handler_duration_seconds" {
			continue
		}
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "kind" {
					counts[l.GetValue()] = s.GetHistogram().GetSampleCount()
				}
			}
			for _, bk := range s.GetHistogram().GetBucket() {
				if ex := bk.GetExemplar(); ex != nil {
					exemplars++
					require.Equal(t, "trace_id", ex.GetLabel()[0].GetName())
				}
			}
		}
	}
	require.Equal(t, map[string]uint64{"succeeded": 1, "retry": 1, "duplicate": 1}, counts)
	require.Equal(t, 3, exemplars, "each observation links to its trace")

	// nil Metrics is a pass-through.
	require.NoError(t, middleware.Metrics(nil)(func(context.Context, *inboxtype.Delivery) error { return nil })(context.Background(), d))
}
