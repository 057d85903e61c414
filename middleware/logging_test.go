package middleware_test

import (
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/middleware"
	"github.com/inboxmq/inboxmq/retry"
)

type logBundle struct {
	obs  consumer.Observer
	logs *observer.ObservedLogs
}

func setupLog(t *testing.T, opts *middleware.LogOpts) *logBundle {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	return &logBundle{obs: middleware.NewLogObserver(zap.New(core), opts), logs: logs}
}

func testDelivery() *consumer.Delivery {
	d := consumer.NewDelivery("payments", "payments-svc", "worker-7", &amqp.Delivery{
		MessageId:   "msg-1",
		Redelivered: true,
		Headers:     amqp.Table{consumer.HeaderAttempt: int32(3), consumer.HeaderDeliveryCount: int64(2)},
	})
	d.Key = "payment:order-42"
	return d
}

func TestLogObserver_LinePerTransition(t *testing.T) {
	t.Parallel()
	b := setupLog(t, nil)
	d := testDelivery()
	d.LockKey = "lock:payment:order-42"
	d.LockResult = "acquired"
	d.Fence = 7

	statuses := []struct {
		status string
		err    error
		level  zapcore.Level
	}{
		{consumer.StatusReceived, nil, zapcore.InfoLevel},
		{consumer.StatusLocked, nil, zapcore.InfoLevel},
		{consumer.StatusLockFailed, errors.New("held"), zapcore.WarnLevel},
		{consumer.StatusLockExpired, errors.New("lost"), zapcore.ErrorLevel},
		{consumer.StatusProcessing, nil, zapcore.InfoLevel},
		{consumer.StatusCompleted, nil, zapcore.InfoLevel},
		{consumer.StatusDuplicate, retry.Duplicate(retry.SourceFenced, nil), zapcore.InfoLevel},
		{consumer.StatusRetry, retry.WithReason("db_deadlock", errors.New("40P01")), zapcore.WarnLevel},
		{consumer.StatusFailed, errors.New("boom"), zapcore.ErrorLevel},
		{consumer.StatusDeadLettered, retry.Permanent(errors.New("bad card")), zapcore.ErrorLevel},
		{consumer.StatusRequeued, errors.New("stopping"), zapcore.WarnLevel},
	}
	for _, s := range statuses {
		b.obs.OnTransition(d, s.status, s.err)
	}

	entries := b.logs.AllUntimed()
	require.Len(t, entries, len(statuses))
	for i, e := range entries {
		s := statuses[i]
		require.Equal(t, "delivery "+s.status, e.Message)
		require.Equal(t, s.level, e.Level, s.status)
		f := e.ContextMap()
		require.Equal(t, s.status, f["status"])
		require.Equal(t, "msg-1", f["message_id"])
		require.Equal(t, "payment:order-42", f["idempotency_key"])
		require.Equal(t, "payments-svc", f["consumer"])
		require.Equal(t, "payments", f["queue"])
		require.Equal(t, "worker-7", f["worker_id"])
		require.Equal(t, int64(3), f["attempt"])
		require.Equal(t, true, f["redelivered"])
		require.Equal(t, int64(2), f["delivery_count"])
		require.Equal(t, "lock:payment:order-42", f["lock_key"])
		require.Equal(t, "acquired", f["lock_result"])
		require.Equal(t, int64(7), f["fence"])
		require.Contains(t, f, "duration")
		if s.err != nil {
			require.Equal(t, s.err.Error(), f["error"])
		} else {
			require.NotContains(t, f, "error")
		}
	}
	require.Equal(t, "fenced", entries[6].ContextMap()["duplicate_source"])
	require.Equal(t, "db_deadlock", entries[7].ContextMap()["reason"])
	require.Equal(t, "permanent", entries[9].ContextMap()["reason"])
}

func TestLogObserver_SamplesSuccessNeverFailures(t *testing.T) {
	t.Parallel()
	b := setupLog(t, &middleware.LogOpts{SampleInterval: time.Hour, SampleFirst: 2, SampleThereafter: 1000})
	d := testDelivery()
	const n = 50
	for range n {
		b.obs.OnTransition(d, consumer.StatusCompleted, nil)
		b.obs.OnTransition(d, consumer.StatusRetry, errors.New("later"))
		b.obs.OnTransition(d, consumer.StatusFailed, errors.New("boom"))
		b.obs.OnTransition(d, consumer.StatusDeadLettered, retry.Permanent(errors.New("poison")))
		b.obs.OnTransition(d, consumer.StatusDuplicate, retry.ErrDuplicate)
		b.obs.OnTransition(d, consumer.StatusLockExpired, errors.New("lost"))
		b.obs.OnInProcessRetry(d, retry.Classify(errors.New("blip")), time.Millisecond)
	}
	require.Equal(t, 2, b.logs.FilterMessage("delivery completed").Len(), "success lines are sampled")
	for _, msg := range []string{
		"delivery retry", "delivery failed", "delivery dead_lettered", "delivery duplicate",
		"delivery lock_expired", "delivery in-process retry",
	} {
		require.Equal(t, n, b.logs.FilterMessage(msg).Len(), msg+" is never sampled")
	}
	require.Equal(t, "inbox", b.logs.FilterMessage("delivery duplicate").AllUntimed()[0].ContextMap()["duplicate_source"])
}

func TestLogObserver_SamplingDisabled(t *testing.T) {
	t.Parallel()
	b := setupLog(t, &middleware.LogOpts{SampleFirst: -1, SuccessLevel: zapcore.DebugLevel})
	d := testDelivery()
	for range 300 {
		b.obs.OnTransition(d, consumer.StatusReceived, nil)
	}
	require.Equal(t, 300, b.logs.FilterMessage("delivery received").FilterLevelExact(zapcore.DebugLevel).Len())
}

func TestLogObserver_OutcomeAndConnState(t *testing.T) {
	t.Parallel()
	b := setupLog(t, nil)
	d := testDelivery()

	b.obs.OnOutcome(d, consumer.Outcome{Action: consumer.ActionAcked})
	require.Zero(t, b.logs.Len(), "a settled delivery adds no line")

	b.obs.OnOutcome(d, consumer.Outcome{
		Action: consumer.ActionRetried, Err: errors.New("publish not confirmed"),
		Decision: retry.Decision{Kind: retry.KindRetry, Reason: "timeout"},
	})
	e := b.logs.FilterMessage("delivery settle failed").AllUntimed()
	require.Len(t, e, 1)
	require.Equal(t, zapcore.ErrorLevel, e[0].Level)
	require.Equal(t, "retried", e[0].ContextMap()["action"])
	require.Equal(t, "publish not confirmed", e[0].ContextMap()["error"])

	b.obs.OnConnState(consumer.ConnConnected, nil)
	b.obs.OnConnState(consumer.ConnDisconnected, errors.New("connection reset"))
	b.obs.OnConnState(consumer.ConnStopped, nil)
	require.Equal(t, zapcore.InfoLevel, b.logs.FilterMessage("broker connected").AllUntimed()[0].Level)
	dis := b.logs.FilterMessage("broker disconnected").AllUntimed()
	require.Len(t, dis, 1)
	require.Equal(t, zapcore.WarnLevel, dis[0].Level)
	require.Equal(t, "connection reset", dis[0].ContextMap()["error"])
	require.Equal(t, 1, b.logs.FilterMessage("broker stopped").Len())
}

func TestLogObserver_NilLogger(t *testing.T) {
	t.Parallel()
	obs := middleware.NewLogObserver(nil, nil)
	obs.OnTransition(testDelivery(), consumer.StatusFailed, errors.New("x"))
	obs.OnConnState(consumer.ConnConnected, nil)
}

func BenchmarkLogObserver_SampledSuccess(b *testing.B) {
	obs := middleware.NewLogObserver(zap.New(zapcore.NewCore(
		zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(discard{}), zapcore.InfoLevel)), nil)
	d := testDelivery()
	b.ReportAllocs()
	for b.Loop() {
		obs.OnTransition(d, consumer.StatusReceived, nil)
		obs.OnTransition(d, consumer.StatusProcessing, nil)
		obs.OnTransition(d, consumer.StatusCompleted, nil)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
