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

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/middleware"
	"github.com/inboxmq/inboxmq/retry"
)

type logBundle struct {
	obs  inboxtype.Observer
	logs *observer.ObservedLogs
}

func setupLog(t *testing.T, opts *middleware.LogOpts) *logBundle {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	return &logBundle{obs: middleware.NewLogObserver(zap.New(core), opts), logs: logs}
}

func testDelivery() *inboxtype.Delivery {
	d := inboxtype.NewDelivery("payments", "payments-svc", "worker-7", &amqp.Delivery{
		MessageId:   "msg-1",
		Redelivered: true,
		Headers:     amqp.Table{inboxtype.HeaderAttempt: int32(3), inboxtype.HeaderDeliveryCount: int64(2)},
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
	d.LockFence = 5
	d.InboxFence = 7

	// Transitions before settlement come through OnTransition; the
	// settlement line comes through OnOutcome, with the settled decision.
	transitions := []struct {
		status inboxtype.Status
		err    error
		level  zapcore.Level
	}{
		{inboxtype.StatusReceived, nil, zapcore.InfoLevel},
		{inboxtype.StatusLocked, nil, zapcore.InfoLevel},
		{inboxtype.StatusLockFailed, errors.New("held"), zapcore.WarnLevel},
		{inboxtype.StatusLockExpired, errors.New("lost"), zapcore.ErrorLevel},
		{inboxtype.StatusProcessing, nil, zapcore.InfoLevel},
		{inboxtype.StatusParked, nil, zapcore.InfoLevel},
	}
	dup := retry.Duplicate(retry.SourceFenced, nil)
	deadlock := retry.WithReason("db_deadlock", errors.New("40P01"))
	badCard := retry.Permanent(errors.New("bad card"))
	stopping := errors.New("stopping")
	outcomes := []struct {
		out    inboxtype.Outcome
		status inboxtype.Status
		err    error
		level  zapcore.Level
	}{
		{inboxtype.Outcome{Action: inboxtype.ActionAcked, Decision: retry.Classify(nil)}, inboxtype.StatusCompleted, nil, zapcore.InfoLevel},
		{inboxtype.Outcome{Action: inboxtype.ActionAcked, Decision: retry.Classify(dup)}, inboxtype.StatusDuplicate, dup, zapcore.InfoLevel},
		{inboxtype.Outcome{Action: inboxtype.ActionRetried, Decision: retry.Classify(deadlock), Delay: 5 * time.Second}, inboxtype.StatusRetry, deadlock, zapcore.WarnLevel},
		{inboxtype.Outcome{Action: inboxtype.ActionDeadLettered, Decision: retry.Classify(badCard)}, inboxtype.StatusDeadLettered, badCard, zapcore.ErrorLevel},
		{inboxtype.Outcome{Action: inboxtype.ActionRequeued, Decision: retry.Decision{Kind: retry.KindInterrupted, Reason: "stopped", Err: stopping}}, inboxtype.StatusRequeued, stopping, zapcore.WarnLevel},
	}
	for _, s := range transitions {
		b.obs.OnTransition(d, s.status, s.err)
	}
	for _, o := range outcomes {
		b.obs.OnTransition(d, o.status, o.err) // written from the outcome instead
		b.obs.OnOutcome(d, o.out)
	}

	entries := b.logs.AllUntimed()
	require.Len(t, entries, len(transitions)+len(outcomes))
	for i, e := range entries {
		status, err, level := inboxtype.Status(""), error(nil), zapcore.InfoLevel
		if i < len(transitions) {
			status, err, level = transitions[i].status, transitions[i].err, transitions[i].level
		} else {
			o := outcomes[i-len(transitions)]
			status, err, level = o.status, o.err, o.level
		}
		require.Equal(t, "delivery "+string(status), e.Message)
		require.Equal(t, level, e.Level, string(status))
		f := e.ContextMap()
		require.Equal(t, string(status), f["status"])
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
		require.Equal(t, int64(5), f["lock_fence"])
		require.Equal(t, int64(7), f["fence"], "fence is the inbox fence")
		require.Contains(t, f, "duration")
		if err != nil {
			require.Equal(t, err.Error(), f["error"])
		} else {
			require.NotContains(t, f, "error")
		}
	}
	byStatus := map[inboxtype.Status]map[string]any{}
	for _, e := range entries {
		byStatus[inboxtype.Status(e.ContextMap()["status"].(string))] = e.ContextMap() //nolint:forcetypeassert // every line has a status
	}
	require.Equal(t, "fenced", byStatus[inboxtype.StatusDuplicate]["duplicate_source"])
	require.Equal(t, "db_deadlock", byStatus[inboxtype.StatusRetry]["reason"])
	require.Equal(t, 5*time.Second, byStatus[inboxtype.StatusRetry]["delay"])
	require.Equal(t, "permanent", byStatus[inboxtype.StatusDeadLettered]["reason"])
	require.Equal(t, "stopped", byStatus[inboxtype.StatusRequeued]["reason"])
	require.NotContains(t, byStatus[inboxtype.StatusCompleted], "reason")
}

// The settlement line takes the reason of the decision the consumer
// settled on, not the default classification of its error.
func TestLogObserver_SettledDecisionDecidesTheReason(t *testing.T) {
	t.Parallel()
	b := setupLog(t, nil)
	err := errors.New("gateway down") // classifies as retry, reason "error"
	b.obs.OnOutcome(testDelivery(), inboxtype.Outcome{
		Action:   inboxtype.ActionDeadLettered,
		Decision: retry.Decision{Kind: retry.KindRetry, Reason: retry.ReasonExhausted, Err: err},
	})
	e := b.logs.FilterMessage("delivery dead_lettered").AllUntimed()
	require.Len(t, e, 1)
	require.Equal(t, retry.ReasonExhausted, e[0].ContextMap()["reason"])
	require.Equal(t, "gateway down", e[0].ContextMap()["error"])
}

func TestLogObserver_SamplesSuccessNeverFailures(t *testing.T) {
	t.Parallel()
	b := setupLog(t, &middleware.LogOpts{SampleInterval: time.Hour, SampleFirst: 2, SampleThereafter: 1000})
	d := testDelivery()
	const n = 50
	for range n {
		b.obs.OnOutcome(d, inboxtype.Outcome{Action: inboxtype.ActionAcked, Decision: retry.Classify(nil)})
		b.obs.OnOutcome(d, inboxtype.Outcome{Action: inboxtype.ActionRetried, Decision: retry.Classify(errors.New("later"))})
		b.obs.OnOutcome(d, inboxtype.Outcome{Action: inboxtype.ActionAbandoned, Decision: retry.Classify(nil), Err: errors.New("boom")})
		b.obs.OnOutcome(d, inboxtype.Outcome{Action: inboxtype.ActionDeadLettered, Decision: retry.Classify(retry.Permanent(errors.New("poison")))})
		b.obs.OnOutcome(d, inboxtype.Outcome{Action: inboxtype.ActionAcked, Decision: retry.Classify(retry.ErrDuplicate)})
		b.obs.OnTransition(d, inboxtype.StatusLockExpired, errors.New("lost"))
		b.obs.OnInProcessRetry(d, retry.Classify(errors.New("blip")), time.Millisecond)
	}
	require.Equal(t, 2, b.logs.FilterMessage("delivery completed").Len(), "success lines are sampled")
	for _, msg := range []string{
		"delivery retry", "delivery failed", "delivery settle failed", "delivery dead_lettered", "delivery duplicate",
		"delivery lock_expired", "delivery retry_in_process",
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
		b.obs.OnTransition(d, inboxtype.StatusReceived, nil)
	}
	require.Equal(t, 300, b.logs.FilterMessage("delivery received").FilterLevelExact(zapcore.DebugLevel).Len())
}

func TestLogObserver_OutcomeAndConnState(t *testing.T) {
	t.Parallel()
	b := setupLog(t, nil)
	d := testDelivery()

	b.obs.OnOutcome(d, inboxtype.Outcome{Action: inboxtype.ActionAcked})
	require.Equal(t, 1, b.logs.FilterMessage("delivery completed").Len())
	require.Zero(t, b.logs.FilterMessage("delivery settle failed").Len(), "a settled delivery adds no settle-failed line")

	b.obs.OnOutcome(d, inboxtype.Outcome{
		Action: inboxtype.ActionRetried, Err: errors.New("publish not confirmed"),
		Decision: retry.Decision{Kind: retry.KindRetry, Reason: "timeout"},
	})
	e := b.logs.FilterMessage("delivery settle failed").AllUntimed()
	require.Len(t, e, 1)
	require.Equal(t, zapcore.ErrorLevel, e[0].Level)
	require.Equal(t, "retried", e[0].ContextMap()["action"])
	require.Equal(t, "publish not confirmed", e[0].ContextMap()["error"])

	b.obs.OnConnState(inboxtype.ConnConnected, nil)
	b.obs.OnConnState(inboxtype.ConnDisconnected, errors.New("connection reset"))
	b.obs.OnConnState(inboxtype.ConnStopped, nil)
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
	obs.OnTransition(testDelivery(), inboxtype.StatusLockExpired, errors.New("x"))
	obs.OnOutcome(testDelivery(), inboxtype.Outcome{Action: inboxtype.ActionAbandoned, Err: errors.New("x")})
	obs.OnConnState(inboxtype.ConnConnected, nil)
}

func BenchmarkLogObserver_SampledSuccess(b *testing.B) {
	obs := middleware.NewLogObserver(zap.New(zapcore.NewCore(
		zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(discard{}), zapcore.InfoLevel)), nil)
	d := testDelivery()
	b.ReportAllocs()
	for b.Loop() {
		obs.OnTransition(d, inboxtype.StatusReceived, nil)
		obs.OnTransition(d, inboxtype.StatusProcessing, nil)
		obs.OnTransition(d, inboxtype.StatusCompleted, nil)
		obs.OnOutcome(d, inboxtype.Outcome{Action: inboxtype.ActionAcked})
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
