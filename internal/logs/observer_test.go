package logs_test

import (
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	logobs "github.com/inboxmq/inboxmq/internal/logs"
	"github.com/inboxmq/inboxmq/internal/logtest"
	"github.com/inboxmq/inboxmq/retry"
)

type logBundle struct {
	obs  inboxtype.Observer
	logs *logtest.Recorder
}

func setupLog(t *testing.T, opts *logobs.Opts) *logBundle {
	t.Helper()
	logger, logs := logtest.New(slog.LevelDebug)
	return &logBundle{obs: logobs.NewObserver(logger, opts), logs: logs}
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
		level  slog.Level
	}{
		{inboxtype.StatusReceived, nil, slog.LevelInfo},
		{inboxtype.StatusLocked, nil, slog.LevelInfo},
		{inboxtype.StatusLockFailed, errors.New("held"), slog.LevelWarn},
		{inboxtype.StatusLockExpired, errors.New("lost"), slog.LevelError},
		{inboxtype.StatusProcessing, nil, slog.LevelInfo},
		{inboxtype.StatusParked, nil, slog.LevelInfo},
	}
	dup := retry.Duplicate(retry.SourceFenced, nil)
	deadlock := retry.WithReason("db_deadlock", errors.New("40P01"))
	badCard := retry.Permanent(errors.New("bad card"))
	stopping := errors.New("stopping")
	outcomes := []struct {
		out    inboxtype.Outcome
		status inboxtype.Status
		err    error
		level  slog.Level
	}{
		{inboxtype.Outcome{Action: inboxtype.ActionAcked, Decision: retry.Classify(nil)}, inboxtype.StatusCompleted, nil, slog.LevelInfo},
		{inboxtype.Outcome{Action: inboxtype.ActionAcked, Decision: retry.Classify(dup)}, inboxtype.StatusDuplicate, nil, slog.LevelInfo}, // no error field
		{inboxtype.Outcome{Action: inboxtype.ActionRetried, Decision: retry.Classify(deadlock), Delay: 5 * time.Second}, inboxtype.StatusRetry, deadlock, slog.LevelWarn},
		{inboxtype.Outcome{Action: inboxtype.ActionDeadLettered, Decision: retry.Classify(badCard)}, inboxtype.StatusDeadLettered, badCard, slog.LevelError},
		{inboxtype.Outcome{Action: inboxtype.ActionRequeued, Decision: retry.Decision{Kind: retry.KindInterrupted, Reason: "stopped", Err: stopping}}, inboxtype.StatusRequeued, stopping, slog.LevelWarn},
	}
	for _, s := range transitions {
		b.obs.OnTransition(d, s.status, s.err)
	}
	for _, o := range outcomes {
		b.obs.OnTransition(d, o.status, o.err) // written from the outcome instead
		b.obs.OnOutcome(d, o.out)
	}

	entries := b.logs.All()
	require.Len(t, entries, len(transitions)+len(outcomes))
	for i, e := range entries {
		status, err, level := inboxtype.Status(""), error(nil), slog.LevelInfo
		if i < len(transitions) {
			status, err, level = transitions[i].status, transitions[i].err, transitions[i].level
		} else {
			o := outcomes[i-len(transitions)]
			status, err, level = o.status, o.err, o.level
		}
		require.Equal(t, "delivery "+string(status), e.Message)
		require.Equal(t, level, e.Level, string(status))
		f := e.Attrs
		require.Equal(t, string(status), f["status"])
		require.Equal(t, "msg-1", f["message_id"])
		require.Equal(t, "payment:order-42", f["idempotency_key"])
		require.Equal(t, "payments-svc", f["namespace"])
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
		byStatus[inboxtype.Status(e.Attrs["status"].(string))] = e.Attrs //nolint:forcetypeassert // every line has a status
	}
	require.Equal(t, "fenced", byStatus[inboxtype.StatusDuplicate]["duplicate_source"])
	require.Equal(t, "db_deadlock", byStatus[inboxtype.StatusRetry]["reason"])
	require.InDelta(t, 5.0, byStatus[inboxtype.StatusRetry]["delay"], 0, "delay in seconds")
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
	e := b.logs.Message("delivery dead_lettered")
	require.Len(t, e, 1)
	require.Equal(t, retry.ReasonExhausted, e[0].Attrs["reason"])
	require.Equal(t, "gateway down", e[0].Attrs["error"])
}

func TestLogObserver_SamplesSuccessNeverFailures(t *testing.T) {
	t.Parallel()
	b := setupLog(t, &logobs.Opts{SampleInterval: time.Hour, SampleFirst: 2, SampleThereafter: 1000})
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
	require.Equal(t, 2, b.logs.Count("delivery completed"), "success lines are sampled")
	for _, msg := range []string{
		"delivery retry", "delivery failed", "delivery settle failed", "delivery dead_lettered", "delivery duplicate",
		"delivery lock_expired", "delivery retry_in_process",
	} {
		require.Equal(t, n, b.logs.Count(msg), msg+" is never sampled")
	}
	require.Equal(t, "inbox", b.logs.Message("delivery duplicate")[0].Attrs["duplicate_source"])
}

func TestLogObserver_SamplingDisabled(t *testing.T) {
	t.Parallel()
	b := setupLog(t, &logobs.Opts{SampleFirst: -1, SuccessLevel: slog.LevelDebug})
	d := testDelivery()
	for range 300 {
		b.obs.OnTransition(d, inboxtype.StatusReceived, nil)
	}
	lines := b.logs.Message("delivery received")
	require.Len(t, lines, 300)
	for _, e := range lines {
		require.Equal(t, slog.LevelDebug, e.Level)
	}
}

func TestLogObserver_OutcomeAndConnState(t *testing.T) {
	t.Parallel()
	b := setupLog(t, nil)
	d := testDelivery()

	b.obs.OnOutcome(d, inboxtype.Outcome{Action: inboxtype.ActionAcked})
	require.Equal(t, 1, b.logs.Count("delivery completed"))
	require.Zero(t, b.logs.Count("delivery settle failed"), "a settled delivery adds no settle-failed line")

	b.obs.OnOutcome(d, inboxtype.Outcome{
		Action: inboxtype.ActionRetried, Err: errors.New("publish not confirmed"),
		Decision: retry.Decision{Kind: retry.KindRetry, Reason: "timeout"},
	})
	e := b.logs.Message("delivery settle failed")
	require.Len(t, e, 1)
	require.Equal(t, slog.LevelError, e[0].Level)
	require.Equal(t, "retried", e[0].Attrs["action"])
	require.Equal(t, "publish not confirmed", e[0].Attrs["error"])

	b.obs.OnConnState(inboxtype.ConnConnected, nil)
	b.obs.OnConnState(inboxtype.ConnDisconnected, errors.New("connection reset"))
	b.obs.OnConnState(inboxtype.ConnStopped, nil)
	require.Equal(t, slog.LevelInfo, b.logs.Message("broker connected")[0].Level)
	dis := b.logs.Message("broker disconnected")
	require.Len(t, dis, 1)
	require.Equal(t, slog.LevelWarn, dis[0].Level)
	require.Equal(t, "connection reset", dis[0].Attrs["error"])
	require.Equal(t, 1, b.logs.Count("broker stopped"))
}

func TestLogObserver_NilLogger(t *testing.T) {
	t.Parallel()
	obs := logobs.NewObserver(nil, nil)
	obs.OnTransition(testDelivery(), inboxtype.StatusLockExpired, errors.New("x"))
	obs.OnOutcome(testDelivery(), inboxtype.Outcome{Action: inboxtype.ActionAbandoned, Err: errors.New("x")})
	obs.OnConnState(inboxtype.ConnConnected, nil)
}

// jsonLogger writes JSON lines to nowhere, the cost of a real handler.
func jsonLogger() *slog.Logger { return slog.New(slog.NewJSONHandler(io.Discard, nil)) } //nolint:sloglint // the cost of a real handler is the point

// The delivery path: sampled success lines (after the first 100 of each
// status per second, the observer only counts).
func BenchmarkLogObserver_SampledSuccess(b *testing.B) {
	obs := logobs.NewObserver(jsonLogger(), nil)
	d := testDelivery()
	b.ReportAllocs()
	for b.Loop() {
		obs.OnTransition(d, inboxtype.StatusReceived, nil)
		obs.OnTransition(d, inboxtype.StatusProcessing, nil)
		obs.OnTransition(d, inboxtype.StatusCompleted, nil)
		obs.OnOutcome(d, inboxtype.Outcome{Action: inboxtype.ActionAcked})
	}
}

// Success lines below the logger's level cost no allocation.
func BenchmarkLogObserver_LevelOff(b *testing.B) {
	obs := logobs.NewObserver(jsonLogger(), &logobs.Opts{SuccessLevel: slog.LevelDebug})
	d := testDelivery()
	b.ReportAllocs()
	for b.Loop() {
		obs.OnTransition(d, inboxtype.StatusReceived, nil)
		obs.OnTransition(d, inboxtype.StatusProcessing, nil)
		obs.OnOutcome(d, inboxtype.Outcome{Action: inboxtype.ActionAcked})
	}
}

// Every line written: what the observer costs on top of the handler.
func BenchmarkLogObserver_Unsampled(b *testing.B) {
	obs := logobs.NewObserver(jsonLogger(), &logobs.Opts{SampleFirst: -1})
	d := testDelivery()
	b.ReportAllocs()
	for b.Loop() {
		obs.OnTransition(d, inboxtype.StatusReceived, nil)
		obs.OnOutcome(d, inboxtype.Outcome{Action: inboxtype.ActionAcked})
	}
}

// A success line below the logger's level, or sampled away, costs the
// delivery path no allocation.
//
//nolint:paralleltest // testing.AllocsPerRun refuses to run beside parallel tests
func TestLogObserver_SkippedLinesDoNotAllocate(t *testing.T) {
	d := testDelivery()
	off := logobs.NewObserver(jsonLogger(), &logobs.Opts{SuccessLevel: slog.LevelDebug})
	sampled := logobs.NewObserver(jsonLogger(), &logobs.Opts{SampleInterval: time.Hour, SampleFirst: 1, SampleThereafter: 1 << 30})
	sampled.OnTransition(d, inboxtype.StatusProcessing, nil) // the one line of the hour
	for name, obs := range map[string]inboxtype.Observer{"level off": off, "sampled away": sampled} {
		allocs := testing.AllocsPerRun(100, func() {
			obs.OnTransition(d, inboxtype.StatusProcessing, nil)
		})
		require.Zero(t, allocs, name)
	}
}

// A duplicate is routine: logged at info, with the layer that caught it
// and where it came from, and no error field.
func TestLogObserver_DuplicateOrigin(t *testing.T) {
	t.Parallel()
	b := setupLog(t, nil)
	dup := inboxtype.Outcome{Action: inboxtype.ActionAcked, Decision: retry.Classify(retry.Duplicate(retry.SourceInbox, nil))}
	for origin, raw := range map[string]*amqp.Delivery{
		"resend":     {MessageId: "m-resend"},
		"redelivery": {MessageId: "m-redelivery", Redelivered: true},
		"retry":      {MessageId: "m-retry", Headers: amqp.Table{inboxtype.HeaderAttempt: int64(3)}},
		"replay":     {MessageId: "m-replay", Redelivered: true, Headers: amqp.Table{inboxtype.HeaderReplayCount: int64(1)}},
	} {
		b.obs.OnOutcome(inboxtype.NewDelivery("payments", "payments", "w1", raw), dup)
		lines := b.logs.Containing("delivery duplicate")
		line := lines[len(lines)-1]
		require.Equal(t, slog.LevelInfo, line.Level, origin)
		require.Equal(t, "m-"+origin, line.Attrs["message_id"])
		require.Equal(t, origin, line.Attrs["duplicate_origin"])
		require.Equal(t, "inbox", line.Attrs["duplicate_source"])
		require.NotContains(t, line.Attrs, "error", "%s: a duplicate is no error", origin)
	}
}
