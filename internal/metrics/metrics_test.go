package metrics_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/metrics"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/retry"
)

type testBundle struct {
	reg *prometheus.Registry
	m   *metrics.Metrics
}

func setup(t *testing.T, cfg *metrics.Config) *testBundle {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(reg, cfg)
	require.NoError(t, err)
	return &testBundle{reg: reg, m: m}
}

func delivery(queue, namespace string, redelivered bool) *inboxtype.Delivery {
	return inboxtype.NewDelivery(queue, namespace, "w1", &amqp.Delivery{MessageId: "m1", Redelivered: redelivered})
}

// value reads one series from the registry: name without the namespace and
// the label values in the series' label order.
func value(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "inboxmq_"+name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matches(m, labels) {
				switch {
				case m.GetCounter() != nil:
					return m.GetCounter().GetValue()
				case m.GetGauge() != nil:
					return m.GetGauge().GetValue()
				case m.GetHistogram() != nil:
					return float64(m.GetHistogram().GetSampleCount())
				}
			}
		}
	}
	t.Fatalf("series inboxmq_%s%v not found", name, labels)
	return 0
}

func matches(m *dto.Metric, labels map[string]string) bool {
	if len(m.GetLabel()) != len(labels) {
		return false
	}
	for _, lp := range m.GetLabel() {
		if labels[lp.GetName()] != lp.GetValue() {
			return false
		}
	}
	return true
}

func qc(extra ...string) map[string]string {
	l := map[string]string{"queue": "payments", "consumer": "payments-svc"}
	for i := 0; i+1 < len(extra); i += 2 {
		l[extra[i]] = extra[i+1]
	}
	return l
}

func TestNew_Defaults(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.m.Init("payments", "payments-svc")
	names, err := b.reg.Gather()
	require.NoError(t, err)
	for _, mf := range names {
		require.True(t, strings.HasPrefix(mf.GetName(), "inboxmq_"), mf.GetName())
	}

	_, err = metrics.New(b.reg, nil)
	require.Error(t, err, "a second Metrics on one registry collides")

	_, err = metrics.New(prometheus.NewRegistry(), &metrics.Config{Buckets: []float64{2, 1}})
	require.Error(t, err)
	_, err = metrics.New(prometheus.NewRegistry(), &metrics.Config{Inbox: &metrics.InboxConfig{}})
	require.Error(t, err)
}

func TestNew_FailedRegistrationRollsBack(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	// Occupy a name that New registers late, so earlier ones must be undone.
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "inboxmq", Name: "broker_connected", Help: "x"}))
	_, err := metrics.New(reg, nil)
	require.Error(t, err)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	require.Len(t, mfs, 1, "only the pre-existing series remains")
}

func TestInit_AllSeriesAtZero(t *testing.T) {
	t.Parallel()
	b := setup(t, &metrics.Config{ExtraReasons: []string{"gateway_5xx"}})
	b.m.Init("payments", "payments-svc")

	for _, s := range []string{retry.SourceCache, retry.SourceInbox, retry.SourceBusiness, retry.SourceFenced, retry.SourceClaimHeld} {
		require.Zero(t, value(t, b.reg, "duplicate_detected_total", qc("source", s)))
	}
	for _, r := range []string{
		retry.ReasonError, retry.ReasonPermanent, retry.ReasonRequested, retry.ReasonTimeout, retry.ReasonDecode,
		retry.ReasonInvalid, retry.ReasonKeyConflict, retry.ReasonPanic, retry.ReasonExhausted,
		"lock_unavailable", "lock_expired", "db_serialization", "db_deadlock", "db_connection", "claim_held",
		"crash_loop", "db_no_partition", "gateway_5xx",
	} {
		require.Zero(t, value(t, b.reg, "job_retry_total", qc("reason", r)), r)
		require.Zero(t, value(t, b.reg, "in_process_retry_total", qc("reason", r)), r)
		require.Zero(t, value(t, b.reg, "dead_lettered_total", qc("reason", r)), r)
	}
	for _, k := range []string{"key_conflict", "business_constraint"} {
		require.Zero(t, value(t, b.reg, "idempotency_conflict_total", qc("kind", k)))
	}
	for _, o := range []string{"completed", "duplicate", "retry", "dead_lettered", "requeued", "abandoned"} {
		require.Zero(t, value(t, b.reg, "job_processing_duration_seconds", qc("outcome", o)))
	}
	for _, k := range []string{"succeeded", "duplicate", "retry", "permanent", "interrupted"} {
		require.Zero(t, value(t, b.reg, "handler_duration_seconds", qc("kind", k)))
	}
	for _, a := range []string{"acked", "retried", "dead_lettered", "requeued", "abandoned"} {
		require.Zero(t, value(t, b.reg, "deliveries_settled_total", qc("action", a)))
		require.Zero(t, value(t, b.reg, "settle_errors_total", qc("action", a)))
	}
	for _, n := range []string{
		"deliveries_received_total", "redelivered_total", "in_flight", "lock_acquire_success_total",
		"lock_acquire_failed_total", "lock_expired_before_completion_total",
	} {
		require.Zero(t, value(t, b.reg, n, qc()), n)
	}
	require.Zero(t, value(t, b.reg, "stale_processing_records_total", map[string]string{"consumer": "payments-svc"}))
	require.Zero(t, value(t, b.reg, "redis_degraded", nil))
	require.Zero(t, value(t, b.reg, "broker_connected", nil))
	require.Zero(t, value(t, b.reg, "broker_reconnects_total", nil))
	require.NoError(t, testutil.GatherAndCompare(b.reg, strings.NewReader(""), "inboxmq_nonexistent"))
}

func TestObserver_Transitions(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.m.Init("payments", "payments-svc")

	d := delivery("payments", "payments-svc", true)
	b.m.OnTransition(d, inboxtype.StatusReceived, nil)
	require.InDelta(t, 1, value(t, b.reg, "deliveries_received_total", qc()), 0)
	require.InDelta(t, 1, value(t, b.reg, "redelivered_total", qc()), 0)
	require.InDelta(t, 1, value(t, b.reg, "in_flight", qc()), 0)

	b.m.OnTransition(d, inboxtype.StatusLocked, nil)
	b.m.OnTransition(d, inboxtype.StatusLockFailed, errors.New("held"))
	b.m.OnTransition(d, inboxtype.StatusLockFailed, errors.New("held"))
	b.m.OnTransition(d, inboxtype.StatusLockExpired, errors.New("lost"))
	b.m.OnTransition(d, inboxtype.StatusProcessing, nil)
	require.InDelta(t, 1, value(t, b.reg, "lock_acquire_success_total", qc()), 0)
	require.InDelta(t, 2, value(t, b.reg, "lock_acquire_failed_total", qc()), 0)
	require.InDelta(t, 1, value(t, b.reg, "lock_expired_before_completion_total", qc()), 0)

	// A fresh delivery, not redelivered: redelivered_total stays.
	b.m.OnTransition(delivery("payments", "payments-svc", false), inboxtype.StatusReceived, nil)
	require.InDelta(t, 2, value(t, b.reg, "deliveries_received_total", qc()), 0)
	require.InDelta(t, 1, value(t, b.reg, "redelivered_total", qc()), 0)
	require.InDelta(t, 2, value(t, b.reg, "in_flight", qc()), 0)
}

func TestObserver_Outcomes(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name    string
		outcome inboxtype.Outcome
		want    map[string]map[string]string // series -> labels that must read 1
	}{
		{
			name:    "completed",
			outcome: inboxtype.Outcome{Decision: retry.Classify(nil), Action: inboxtype.ActionAcked, Duration: 20 * time.Millisecond},
			want: map[string]map[string]string{
				"deliveries_settled_total":        qc("action", "acked"),
				"job_processing_duration_seconds": qc("outcome", "completed"),
			},
		},
		{
			name:    "duplicate from the cache",
			outcome: inboxtype.Outcome{Decision: retry.Classify(retry.Duplicate(retry.SourceCache, nil)), Action: inboxtype.ActionAcked},
			want: map[string]map[string]string{
				"duplicate_detected_total":        qc("source", "cache"),
				"job_processing_duration_seconds": qc("outcome", "duplicate"),
			},
		},
		{
			name:    "duplicate from a business constraint",
			outcome: inboxtype.Outcome{Decision: retry.Classify(retry.Duplicate(retry.SourceBusiness, nil)), Action: inboxtype.ActionAcked},
			want: map[string]map[string]string{
				"duplicate_detected_total":   qc("source", "business_constraint"),
				"idempotency_conflict_total": qc("kind", "business_constraint"),
			},
		},
		{
			name:    "plain ErrDuplicate counts as inbox",
			outcome: inboxtype.Outcome{Decision: retry.Decision{Kind: retry.KindDuplicate, Err: retry.ErrDuplicate}, Action: inboxtype.ActionAcked},
			want:    map[string]map[string]string{"duplicate_detected_total": qc("source", "inbox")},
		},
		{
			name:    "key conflict",
			outcome: inboxtype.Outcome{Decision: retry.Classify(retry.ErrKeyConflict), Action: inboxtype.ActionDeadLettered},
			want: map[string]map[string]string{
				"idempotency_conflict_total":      qc("kind", "key_conflict"),
				"dead_lettered_total":             qc("reason", "key_conflict"),
				"job_processing_duration_seconds": qc("outcome", "dead_lettered"),
			},
		},
		{
			name:    "broker retry",
			outcome: inboxtype.Outcome{Decision: retry.Classify(retry.WithReason("lock_unavailable", errors.New("held"))), Action: inboxtype.ActionRetried, Delay: time.Second},
			want: map[string]map[string]string{
				"job_retry_total":                 qc("reason", "lock_unavailable"),
				"deliveries_settled_total":        qc("action", "retried"),
				"job_processing_duration_seconds": qc("outcome", "retry"),
			},
		},
		{
			name:    "requeued",
			outcome: inboxtype.Outcome{Decision: retry.Classify(retry.Interrupted(errors.New("stop"))), Action: inboxtype.ActionRequeued},
			want:    map[string]map[string]string{"job_processing_duration_seconds": qc("outcome", "requeued")},
		},
		{
			name:    "abandoned with a settle error",
			outcome: inboxtype.Outcome{Decision: retry.Classify(nil), Action: inboxtype.ActionAbandoned, Err: errors.New("channel closed")},
			want: map[string]map[string]string{
				"settle_errors_total":             qc("action", "abandoned"),
				"job_processing_duration_seconds": qc("outcome", "abandoned"),
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			b.m.Init("payments", "payments-svc")
			d := delivery("payments", "payments-svc", false)
			b.m.OnTransition(d, inboxtype.StatusReceived, nil)
			b.m.OnOutcome(d, tt.outcome)
			require.Zero(t, value(t, b.reg, "in_flight", qc()))
			require.InDelta(t, 1, value(t, b.reg, "deliveries_settled_total", qc("action", string(tt.outcome.Action))), 0)
			for name, labels := range tt.want {
				require.InDelta(t, 1, value(t, b.reg, name, labels), 0, "%s%v", name, labels)
			}
		})
	}
}

func TestObserver_DurationObserved(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	d := delivery("payments", "payments-svc", false)
	b.m.OnOutcome(d, inboxtype.Outcome{Action: inboxtype.ActionAcked, Duration: 1500 * time.Millisecond})
	mfs, err := b.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "inboxmq_job_processing_duration_seconds" {
			require.InDelta(t, 1.5, mf.GetMetric()[0].GetHistogram().GetSampleSum(), 1e-9)
			return
		}
	}
	t.Fatal("histogram not found")
}

// The handler's run time comes with the outcome (Outcome.Handled): one
// observation per settled delivery, under its decision's kind, with the
// delivery's trace id as the exemplar; nothing when no handler ran.
func TestObserver_HandlerDurationWithExemplar(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	traced := delivery("payments", "payments-svc", false)
	traced.TraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	b.m.OnOutcome(traced, inboxtype.Outcome{Decision: retry.Decision{Kind: retry.KindSucceeded}, Action: inboxtype.ActionAcked, Handled: 20 * time.Millisecond})
	b.m.OnOutcome(delivery("payments", "payments-svc", false), inboxtype.Outcome{
		Decision: retry.Decision{Kind: retry.KindRetry}, Action: inboxtype.ActionRetried, Handled: 30 * time.Millisecond,
	})
	b.m.OnOutcome(delivery("payments", "payments-svc", false), inboxtype.Outcome{
		Decision: retry.Decision{Kind: retry.KindPermanent, Reason: "broker_expired"}, Action: inboxtype.ActionDeadLettered,
	})
	mfs, err := b.reg.Gather()
	require.NoError(t, err)
	counts := map[string]uint64{}
	var exemplars []string
	for _, mf := range mfs {
		if mf.GetName() != "inboxmq_handler_duration_seconds" {
			continue
		}
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "kind" {
					counts[l.GetValue()] += s.GetHistogram().GetSampleCount()
				}
			}
			for _, bk := range s.GetHistogram().GetBucket() {
				if ex := bk.GetExemplar(); ex != nil {
					exemplars = append(exemplars, ex.GetLabel()[0].GetValue())
				}
			}
		}
	}
	require.Equal(t, map[string]uint64{"succeeded": 1, "retry": 1}, counts, "no run, no observation")
	require.Equal(t, []string{traced.TraceID}, exemplars)
}

func TestObserver_InProcessRetry(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	d := delivery("payments", "payments-svc", false)
	dec := retry.Classify(retry.WithReason("db_serialization", errors.New("40001")))
	b.m.OnInProcessRetry(d, dec, 10*time.Millisecond)
	b.m.OnInProcessRetry(d, dec, 20*time.Millisecond)
	require.InDelta(t, 2, value(t, b.reg, "job_retry_total", qc("reason", "db_serialization")), 0)
	require.InDelta(t, 2, value(t, b.reg, "in_process_retry_total", qc("reason", "db_serialization")), 0)
	// A decision without a reason falls back to the kind's default.
	b.m.OnInProcessRetry(d, retry.Decision{Kind: retry.KindRetry}, 0)
	require.InDelta(t, 1, value(t, b.reg, "job_retry_total", qc("reason", "error")), 0)
}

func TestObserver_ConnState(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.m.OnConnState(inboxtype.ConnConnected, nil)
	require.InDelta(t, 1, value(t, b.reg, "broker_connected", nil), 0)
	require.Zero(t, value(t, b.reg, "broker_reconnects_total", nil), "the first connection is not a reconnect")
	b.m.OnConnState(inboxtype.ConnDisconnected, errors.New("EOF"))
	require.Zero(t, value(t, b.reg, "broker_connected", nil))
	b.m.OnConnState(inboxtype.ConnConnected, nil)
	require.InDelta(t, 1, value(t, b.reg, "broker_connected", nil), 0)
	require.InDelta(t, 1, value(t, b.reg, "broker_reconnects_total", nil), 0)
	b.m.OnConnState(inboxtype.ConnStopped, nil)
	require.Zero(t, value(t, b.reg, "broker_connected", nil))
}

func TestBrokerNode(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	node := func(n, role string) map[string]string { return map[string]string{"node": n, "role": role} }
	b.m.InitBrokerNodes("consumer", "r1:5672", "r2:5672")
	require.Zero(t, value(t, b.reg, "broker_node_connections", node("r2:5672", "consumer")), "initialised at 0")
	require.Zero(t, value(t, b.reg, "broker_connections_total", node("r2:5672", "consumer")))

	b.m.BrokerNode("consumer", "r1:5672", true)
	require.InDelta(t, 1, value(t, b.reg, "broker_node_connections", node("r1:5672", "consumer")), 0)
	b.m.BrokerNode("consumer", "r1:5672", false) // r1 went away
	b.m.BrokerNode("consumer", "r2:5672", true)  // failover
	require.Zero(t, value(t, b.reg, "broker_node_connections", node("r1:5672", "consumer")))
	require.InDelta(t, 1, value(t, b.reg, "broker_node_connections", node("r2:5672", "consumer")), 0)
	require.InDelta(t, 1, value(t, b.reg, "broker_connections_total", node("r1:5672", "consumer")), 0)
	require.InDelta(t, 1, value(t, b.reg, "broker_connections_total", node("r2:5672", "consumer")), 0)
}

func TestHooks(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	require.False(t, b.m.RedisDegraded())
	b.m.SetRedisDegraded(true)
	require.True(t, b.m.RedisDegraded())
	require.InDelta(t, 1, value(t, b.reg, "redis_degraded", nil), 0)
	b.m.SetRedisDegraded(false)
	require.Zero(t, value(t, b.reg, "redis_degraded", nil))

	b.m.StaleRecords("payments-svc", 3)
	b.m.StaleRecords("payments-svc", 0)
	b.m.StaleRecords("payments-svc", -1)
	require.InDelta(t, 3, value(t, b.reg, "stale_processing_records_total", map[string]string{"consumer": "payments-svc"}), 0)
}

func TestUnregister(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.m.Unregister(b.reg)
	_, err := metrics.New(b.reg, nil)
	require.NoError(t, err)
}

func TestInbox_Gauges(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Schema(t)
	ctx := t.Context()
	_, err := pool.Exec(ctx, `INSERT INTO inboxmq_inbox (consumer, key, status, owner, lease_until, updated_at) VALUES
		('payments-svc', 'k1', 'completed', NULL, NULL, now()),
		('payments-svc', 'k2', 'completed', NULL, NULL, now()),
		('payments-svc', 'k3', 'processing', 'w1', now() - interval '1 minute', now() - interval '5 minutes'),
		('payments-svc', 'k4', 'processing', 'w2', now() + interval '1 minute', now() - interval '10 seconds'),
		('refunds', 'k1', 'dead', NULL, NULL, now())`)
	require.NoError(t, err)

	b := setup(t, &metrics.Config{Inbox: &metrics.InboxConfig{DB: pool, MinInterval: -1}})
	b.m.Init("payments", "payments-svc")
	b.m.Init("shipping", "shipping")

	cons := func(c string, extra ...string) map[string]string {
		l := map[string]string{"consumer": c}
		for i := 0; i+1 < len(extra); i += 2 {
			l[extra[i]] = extra[i+1]
		}
		return l
	}
	require.InDelta(t, 1, value(t, b.reg, "inbox_scrape_success", nil), 0)
	require.InDelta(t, 2, value(t, b.reg, "inbox_rows", cons("payments-svc", "status", "completed")), 0)
	require.InDelta(t, 2, value(t, b.reg, "inbox_rows", cons("payments-svc", "status", "processing")), 0)
	require.Zero(t, value(t, b.reg, "inbox_rows", cons("payments-svc", "status", "failed")))
	require.InDelta(t, 1, value(t, b.reg, "inbox_rows", cons("refunds", "status", "dead")), 0)
	require.Zero(t, value(t, b.reg, "inbox_rows", cons("shipping", "status", "completed")), "an Init'd consumer without rows reads zero")
	require.InDelta(t, 1, value(t, b.reg, "inbox_expired_claims", cons("payments-svc")), 0)
	require.InDelta(t, 300, value(t, b.reg, "oldest_processing_claim_age_seconds", cons("payments-svc")), 30)
	require.Zero(t, value(t, b.reg, "oldest_processing_claim_age_seconds", cons("shipping")))
}

func TestInbox_QueryFailureKeepsScrapeAlive(t *testing.T) {
	t.Parallel()
	b := setup(t, &metrics.Config{Inbox: &metrics.InboxConfig{DB: failingDB{}, MinInterval: -1}})
	b.m.Init("payments", "payments-svc")
	require.Zero(t, value(t, b.reg, "inbox_scrape_success", nil))
	require.Zero(t, value(t, b.reg, "inbox_rows", map[string]string{"consumer": "payments-svc", "status": "completed"}))
	require.Zero(t, value(t, b.reg, "deliveries_received_total", qc()), "the rest of the scrape is served")
}

func TestInbox_MinIntervalCaches(t *testing.T) {
	t.Parallel()
	db := &countingDB{}
	b := setup(t, &metrics.Config{Inbox: &metrics.InboxConfig{DB: db, MinInterval: time.Hour}})
	_, err := b.reg.Gather()
	require.NoError(t, err)
	_, err = b.reg.Gather()
	require.NoError(t, err)
	require.Equal(t, 1, db.calls)
}

type failingDB struct{}

func (failingDB) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errors.New("connection refused")
}

type countingDB struct{ calls int }

func (c *countingDB) Query(context.Context, string, ...any) (pgx.Rows, error) {
	c.calls++
	return nil, errors.New("unavailable")
}

func BenchmarkMetrics_Delivery(b *testing.B) {
	m, err := metrics.New(prometheus.NewRegistry(), nil)
	require.NoError(b, err)
	m.Init("payments", "payments-svc")
	d := delivery("payments", "payments-svc", false)
	o := inboxtype.Outcome{Decision: retry.Classify(nil), Action: inboxtype.ActionAcked, Duration: 3 * time.Millisecond}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.OnTransition(d, inboxtype.StatusReceived, nil)
			m.OnTransition(d, inboxtype.StatusProcessing, nil)
			m.OnTransition(d, inboxtype.StatusCompleted, nil)
			m.OnOutcome(d, o)
		}
	})
}

// One Redis user recovering must not clear the flag while another is still
// degraded.
func TestMetrics_RedisDegradedPerComponent(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, nil)
	require.NoError(t, err)
	lock, cache := m.RedisDegradedHook("lock"), m.RedisDegradedHook("cache")
	gauge := func() float64 { return value(t, reg, "redis_degraded", nil) }
	lock(true)
	cache(true)
	require.Equal(t, 1.0, gauge())
	cache(false)
	require.Equal(t, 1.0, gauge(), "the lock is still degraded")
	require.True(t, m.RedisDegraded())
	lock(false)
	require.Equal(t, 0.0, gauge())
	require.False(t, m.RedisDegraded())
}

func TestMetrics_BreakerStateAndTransitions(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	l := map[string]string{"queue": "payments", "downstream": "gateway"}
	to := func(s string) map[string]string {
		return map[string]string{"queue": "payments", "downstream": "gateway", "to": s}
	}
	b.m.InitBreaker("payments", "gateway")
	require.Zero(t, value(t, b.reg, "breaker_state", l))
	require.Zero(t, value(t, b.reg, "breaker_transitions_total", to("open")))

	b.m.BreakerTransition("payments", "gateway", metrics.BreakerOpen)
	require.InDelta(t, 2, value(t, b.reg, "breaker_state", l), 0)
	b.m.BreakerTransition("payments", "gateway", metrics.BreakerHalfOpen)
	require.InDelta(t, 1, value(t, b.reg, "breaker_state", l), 0)
	b.m.BreakerTransition("payments", "gateway", metrics.BreakerClosed)
	b.m.BreakerTransition("payments", "gateway", 7) // ignored
	require.Zero(t, value(t, b.reg, "breaker_state", l))
	require.InDelta(t, 1, value(t, b.reg, "breaker_transitions_total", to("open")), 0)
	require.InDelta(t, 1, value(t, b.reg, "breaker_transitions_total", to("half_open")), 0)
	require.InDelta(t, 1, value(t, b.reg, "breaker_transitions_total", to("closed")), 0)
}

func TestMetrics_RateLimitWait(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	hook := b.m.RateLimitWaitHook("gateway")
	l := map[string]string{"downstream": "gateway"}
	require.Zero(t, value(t, b.reg, "ratelimit_wait_seconds", l), "initialised")
	hook(0)
	hook(20 * time.Millisecond)
	require.InDelta(t, 2, value(t, b.reg, "ratelimit_wait_seconds", l), 0)
}

// Critical time runs from the message's publication to its effect's
// commit: only for a job done (succeeded and acked), from the producer's
// x-published-at, else the AMQP timestamp, 0 for a producer's clock ahead
// of ours, nothing without either.
func TestObserver_CriticalTime(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	done := inboxtype.Outcome{Decision: retry.Decision{Kind: retry.KindSucceeded}, Action: inboxtype.ActionAcked, Duration: 500 * time.Millisecond}
	at := func(published time.Time) *inboxtype.Delivery {
		return inboxtype.NewDelivery("payments", "payments-svc", "w1", &amqp.Delivery{MessageId: "m1", Timestamp: published})
	}

	d := at(time.Now().Add(-90 * time.Second)) // published 90 s ago: retries and a backlog
	b.m.OnOutcome(d, done)
	b.m.OnOutcome(at(time.Now().Add(time.Hour)), done) // a clock ahead
	b.m.OnOutcome(at(time.Time{}), done)               // no timestamp
	// The producer's header: published 2 ms before its effect began, in a
	// second whose AMQP timestamp says an hour ago.
	p := at(time.Now().Add(-time.Hour))
	p.Headers = amqp.Table{inboxtype.HeaderPublishedAt: time.Now().Add(-2 * time.Millisecond).UnixMicro()}
	b.m.OnOutcome(p, inboxtype.Outcome{Decision: retry.Decision{Kind: retry.KindSucceeded}, Action: inboxtype.ActionAcked, Duration: time.Millisecond})
	b.m.OnOutcome(at(time.Now()), inboxtype.Outcome{Decision: retry.Decision{Kind: retry.KindDuplicate}, Action: inboxtype.ActionAcked})
	b.m.OnOutcome(at(time.Now()), inboxtype.Outcome{Decision: retry.Decision{Kind: retry.KindRetry}, Action: inboxtype.ActionRetried})

	mfs, err := b.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "inboxmq_critical_time_seconds" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		require.Equal(t, uint64(3), h.GetSampleCount(), "the three jobs done with a publication time")
		want := d.ReceivedAt.Add(done.Duration).Sub(d.Raw.Timestamp).Seconds() // and 0 for the clock ahead
		want += p.ReceivedAt.Add(time.Millisecond).Sub(time.UnixMicro(int64(inboxtype.HeaderInt(p.Headers, inboxtype.HeaderPublishedAt)))).Seconds()
		require.InDelta(t, want, h.GetSampleSum(), 1e-6)
		require.Equal(t, uint64(2), h.GetBucket()[0].GetCumulativeCount(), "under 5 ms: the clock ahead (0), and the job the header dates to the microsecond (about 3 ms; its timestamp says an hour)")
		return
	}
	t.Fatal("histogram not found")
}

// The critical time's buckets tell a p99 of 25 ms from one of 40 ms: jobs
// done 18 ms and 35 ms after their publication fall in buckets of their
// own, not both in one from 25 to 50 ms.
func TestObserver_CriticalTimeResolvesTensOfMilliseconds(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, ms := range []int64{18, 35} {
		published := time.Now().Add(-time.Duration(ms) * time.Millisecond).UnixMicro()
		d := inboxtype.NewDelivery("payments", "payments-svc", "w1", &amqp.Delivery{MessageId: "m1",
			Headers: amqp.Table{inboxtype.HeaderPublishedAt: published}})
		b.m.OnOutcome(d, inboxtype.Outcome{Decision: retry.Decision{Kind: retry.KindSucceeded}, Action: inboxtype.ActionAcked})
	}
	mfs, err := b.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "inboxmq_critical_time_seconds" {
			continue
		}
		cum := map[float64]uint64{}
		for _, bk := range mf.GetMetric()[0].GetHistogram().GetBucket() {
			cum[bk.GetUpperBound()] = bk.GetCumulativeCount()
		}
		require.Equal(t, map[string]uint64{"15ms": 0, "20ms": 1, "30ms": 1, "40ms": 2},
			map[string]uint64{"15ms": cum[.015], "20ms": cum[.02], "30ms": cum[.03], "40ms": cum[.04]})
		return
	}
	t.Fatal("histogram not found")
}
