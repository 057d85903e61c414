package metrics

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// Reasons that the lock, inbox and consumer layers put on retries and dead
// letters in addition to the retry.Reason* constants. They are bounded, so
// they are safe as label values; [Metrics.Init] pre-initialises them.
const (
	ReasonLockUnavailable = "lock_unavailable" // another worker holds the Redis lock
	ReasonLockExpired     = "lock_expired"     // the lock or lease was lost before completion
	ReasonDBSerialization = "db_serialization" // PostgreSQL serialization failure (40001)
	ReasonDBDeadlock      = "db_deadlock"      // PostgreSQL deadlock detected (40P01)
	ReasonDBConnection    = "db_connection"    // the database connection failed
	ReasonDBNoPartition   = "db_no_partition"  // a partitioned inbox has no partition for the row (its partitions ahead ran out)
	ReasonClaimHeld       = "claim_held"       // another worker holds a live claim
	ReasonCrashLoop       = "crash_loop"       // the delivery count passed the crash-loop bound
	ReasonBreakerOpen     = "breaker_open"     // a circuit breaker held the delivery back (not an attempt)
	ReasonRateLimited     = "rate_limited"     // a downstream's rate limit deferred the delivery (not an attempt)
	ReasonKeyDeferred     = "key_deferred"     // an earlier run of its key or tenant asked for a delay (not an attempt)
	ReasonKeyDead         = "key_dead"         // a new delivery of a dead-lettered key its route rejects
)

// Conflict kinds: the bounded values of idempotency_conflict_total{kind}.
const (
	// ConflictKeyConflict: the same idempotency key arrived with a different
	// payload (retry.ErrKeyConflict); the delivery is dead-lettered.
	ConflictKeyConflict = "key_conflict"
	// ConflictBusinessConstraint: a unique violation on a business table
	// caught a duplicate the inbox did not (retry.SourceBusiness).
	ConflictBusinessConstraint = "business_constraint"
)

// Outcomes: the bounded values of job_processing_duration_seconds{outcome}.
// They mirror the final status of a delivery.
const (
	OutcomeCompleted    = "completed"     // the effect committed; acked
	OutcomeDuplicate    = "duplicate"     // already done; acked
	OutcomeRetry        = "retry"         // republished to a delay tier
	OutcomeDeadLettered = "dead_lettered" // republished to the DLQ
	OutcomeRequeued     = "requeued"      // nacked with requeue (shutdown)
	OutcomeAbandoned    = "abandoned"     // could not be settled; the broker redelivers
)

var (
	knownReasons = []string{
		retry.ReasonError, retry.ReasonPermanent, retry.ReasonRequested, retry.ReasonTimeout,
		retry.ReasonDecode, retry.ReasonInvalid, retry.ReasonKeyConflict, retry.ReasonPanic,
		retry.ReasonExhausted,
		ReasonLockUnavailable, ReasonLockExpired, ReasonDBSerialization, ReasonDBDeadlock,
		ReasonDBConnection, ReasonDBNoPartition, ReasonClaimHeld, ReasonCrashLoop, ReasonBreakerOpen, ReasonRateLimited,
		ReasonKeyDeferred, ReasonKeyDead,
		// The consumer files what the broker dead-lettered with the
		// broker's x-death reason: "broker_" + expired, delivery_limit,
		// rejected or maxlen ("broker" without one).
		"broker_expired", "broker_delivery_limit", "broker_rejected", "broker_maxlen", "broker",
	}
	knownSources = []string{
		retry.SourceCache, retry.SourceInbox, retry.SourceBusiness, retry.SourceFenced, retry.SourceClaimHeld,
	}
	knownKinds    = []string{ConflictKeyConflict, ConflictBusinessConstraint}
	knownOutcomes = []string{
		OutcomeCompleted, OutcomeDuplicate, OutcomeRetry, OutcomeDeadLettered, OutcomeRequeued, OutcomeAbandoned,
	}
	knownActions = []inboxtype.Action{
		inboxtype.ActionAcked, inboxtype.ActionRetried, inboxtype.ActionDeadLettered,
		inboxtype.ActionRequeued, inboxtype.ActionAbandoned,
	}
)

// DefaultBuckets are the processing-time histogram buckets in seconds, from
// a fast cached duplicate (1ms) to a slow outside call (60s).
var DefaultBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// criticalTimeBuckets are the critical_time_seconds buckets in seconds:
// from a job done at once (5ms) to one that waited out retries (1h),
// finest from 10 to 100 ms, where a latency objective for jobs done at
// once is set (a p99 of 25 ms can be told from one of 40 ms).
var criticalTimeBuckets = []float64{.005, .01, .015, .02, .025, .03, .04, .05, .075, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}

// publishedAt is when d was first published: its HeaderPublishedAt, else
// its AMQP timestamp (whole seconds).
func publishedAt(d *inboxtype.Delivery) (time.Time, bool) {
	if us := inboxtype.HeaderInt(d.Headers, inboxtype.HeaderPublishedAt); us > 0 {
		return time.UnixMicro(int64(us)), true
	}
	if d.Raw != nil && !d.Raw.Timestamp.IsZero() {
		return d.Raw.Timestamp, true
	}
	return time.Time{}, false
}

// Config configures [New]. A nil *Config means all defaults.
type Config struct {
	// Namespace prefixes every series name ("<namespace>_<name>").
	// Defaults to "inboxmq".
	Namespace string
	// ConstLabels are added to every series (say, {"service": "payments"}).
	// Defaults to none.
	ConstLabels prometheus.Labels
	// Buckets are the job_processing_duration_seconds buckets in seconds.
	// Defaults to [DefaultBuckets].
	Buckets []float64
	// ExtraReasons are further retry and dead-letter reasons (from your own
	// retry.WithReason calls) that [Metrics.Init] pre-initialises. Defaults to
	// none; the built-in reasons are always included.
	ExtraReasons []string
	// Inbox, when set, adds the inbox gauges (inbox_rows,
	// oldest_processing_claim_age_seconds, inbox_expired_claims), read from
	// the inbox table on scrape. Defaults to nil: no inbox gauges.
	Inbox *InboxConfig
}

func (c *Config) withDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Namespace == "" {
		out.Namespace = "inboxmq"
	}
	if len(out.Buckets) == 0 {
		out.Buckets = DefaultBuckets
	}
	return out
}

func (c Config) validate() error {
	if !slices.IsSorted(c.Buckets) {
		return errors.New("metrics: Buckets must be sorted in increasing order")
	}
	if c.Inbox != nil && c.Inbox.DB == nil {
		return errors.New("metrics: Inbox.DB is required when Inbox is set")
	}
	return nil
}

// Metrics holds inboxmq's Prometheus series. It implements
// [inboxtype.Observer], so the consumer reports every delivery to it, and has
// methods the lock, cache and reconciler call ([Metrics.SetRedisDegraded],
// [Metrics.StaleRecords]). It is safe for concurrent use. The zero value is
// not usable: build one with [New].
type Metrics struct {
	inboxtype.NopObserver

	extraReasons []string

	received     *prometheus.CounterVec
	redelivered  *prometheus.CounterVec
	settled      *prometheus.CounterVec
	inFlight     *prometheus.GaugeVec
	duplicates   *prometheus.CounterVec
	lockOK       *prometheus.CounterVec
	lockFailed   *prometheus.CounterVec
	lockExpired  *prometheus.CounterVec
	retries      *prometheus.CounterVec
	inProcess    *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	conflicts    *prometheus.CounterVec
	deadLettered *prometheus.CounterVec
	stale        *prometheus.CounterVec
	settleErrors *prometheus.CounterVec
	handlerTime  *prometheus.HistogramVec
	critical     *prometheus.HistogramVec
	stuck        *prometheus.GaugeVec

	redisDegraded      prometheus.Gauge
	workersStale       prometheus.Gauge
	degraded           atomic.Bool
	degradedMu         sync.Mutex
	degradedBy         map[string]bool // Redis users currently degraded
	reconnects         prometheus.Counter
	connected          prometheus.Gauge
	nodeConns          *prometheus.GaugeVec
	nodeOpened         *prometheus.CounterVec
	breakerState       *prometheus.GaugeVec
	breakerTransitions *prometheus.CounterVec
	rateLimitWait      *prometheus.HistogramVec
	everConnected      atomic.Bool
	inbox              *inboxCollector
	perRoute           sync.Map // routeKey -> *routeSeries
	registeredOrder    []prometheus.Collector
}

type routeKey struct{ queue, consumer string }

// routeSeries caches the children whose only labels are queue and consumer,
// so the hot path does no label hashing for them.
type routeSeries struct {
	received, redelivered, lockOK, lockFailed, lockExpired prometheus.Counter
	inFlight                                               prometheus.Gauge
}

// New builds the series and registers them with reg. A nil reg means
// prometheus.DefaultRegisterer. It fails if a series is already registered
// (two Metrics with the same namespace on one registry) or the config is
// invalid.
func New(reg prometheus.Registerer, cfg *Config) (*Metrics, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	ns := c.Namespace
	qc := []string{"queue", "consumer"}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: name, Help: help, ConstLabels: c.ConstLabels,
		}, labels)
	}
	m := &Metrics{
		extraReasons: slices.Clone(c.ExtraReasons),
		received:     counter("deliveries_received_total", "Deliveries received from the broker.", qc...),
		redelivered: counter("redelivered_total",
			"Deliveries the broker flagged as redelivered (an earlier delivery was not acked).", qc...),
		settled: counter("deliveries_settled_total",
			"Deliveries settled, by what the consumer did (acked, retried, dead_lettered, requeued, abandoned).",
			"queue", "consumer", "action"),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "in_flight", Help: "Deliveries received and not yet settled.",
			ConstLabels: c.ConstLabels,
		}, qc),
		duplicates: counter("duplicate_detected_total",
			"Duplicate deliveries acked without a second effect, by where they were caught.",
			"queue", "consumer", "source"),
		lockOK:     counter("lock_acquire_success_total", "Redis locks acquired.", qc...),
		lockFailed: counter("lock_acquire_failed_total", "Redis lock acquisitions that failed (held elsewhere).", qc...),
		lockExpired: counter("lock_expired_before_completion_total",
			"Locks or leases lost before the handler completed (processing outlived the TTL).", qc...),
		retries: counter("job_retry_total",
			"Retries (in-process and broker-side), by reason.", "queue", "consumer", "reason"),
		inProcess: counter("in_process_retry_total",
			"In-process retries (a subset of job_retry_total), by reason.", "queue", "consumer", "reason"),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "job_processing_duration_seconds",
			Help:        "Time from receipt to settlement of a delivery, by outcome.",
			ConstLabels: c.ConstLabels, Buckets: c.Buckets,
		}, []string{"queue", "consumer", "outcome"}),
		conflicts: counter("idempotency_conflict_total",
			"Idempotency conflicts: a key reused with another payload (key_conflict) or a duplicate caught by a business unique constraint (business_constraint).",
			"queue", "consumer", "kind"),
		deadLettered: counter("dead_lettered_total", "Deliveries dead-lettered, by reason.",
			"queue", "consumer", "reason"),
		stale: counter("stale_processing_records_total",
			"Claims found past their lease by the reconciler.", "consumer"),
		settleErrors: counter("settle_errors_total",
			"Deliveries whose ack, nack or republish failed (requeued or redelivered, then held back longer each time).",
			"queue", "consumer", "action"),
		handlerTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "handler_duration_seconds",
			Help:        "Time the last run of the middleware chain and handler (lock, inbox, business work) of each settled delivery took, by the kind of its decision.",
			ConstLabels: c.ConstLabels, Buckets: c.Buckets,
		}, []string{"queue", "consumer", "kind"}),
		critical: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "critical_time_seconds",
			Help:        "Time from a message's publication (its AMQP timestamp) to the commit of its effect, retries and waits in the queue included, for each delivery that completed its job.",
			ConstLabels: c.ConstLabels, Buckets: criticalTimeBuckets,
		}, qc),
		stuck: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "handlers_stuck", ConstLabels: c.ConstLabels,
			Help: "Handlers still running a while after their context ended (deadline or stop; a quarter of the handler timeout, at most 10s): they ignore cancellation and hold a slot each.",
		}, qc),
		workersStale: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "workers_stale", ConstLabels: c.ConstLabels,
			Help: "Other workers whose presence row stopped being refreshed without a graceful stop, 15s to 15m ago (crashed, frozen or cut off from PostgreSQL), as this worker sees them.",
		}),
		redisDegraded: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "redis_degraded", ConstLabels: c.ConstLabels,
			Help: "1 while Redis is unreachable and the cache and lock are bypassed and rate limits kept per worker (correctness holds; speed drops).",
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "broker_reconnects_total", ConstLabels: c.ConstLabels,
			Help: "Reconnections to the broker after a lost connection.",
		}),
		breakerState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "breaker_state", ConstLabels: c.ConstLabels,
			Help: "State of a circuit breaker guarding a queue: 0 closed, 1 half-open (probing), 2 open (queue paused).",
		}, []string{"queue", "downstream"}),
		rateLimitWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "ratelimit_wait_seconds",
			Help:        "Time a delivery waited for its slot of a downstream's rate limit (0 when the limit is not biting).",
			ConstLabels: c.ConstLabels, Buckets: c.Buckets,
		}, []string{"downstream"}),
		breakerTransitions: counter("breaker_transitions_total",
			"Circuit breaker transitions, by the state entered (closed, half_open, open).", "queue", "downstream", "to"),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "broker_connected", ConstLabels: c.ConstLabels,
			Help: "1 while connected to the broker and consuming.",
		}),
		nodeConns: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "broker_node_connections", ConstLabels: c.ConstLabels,
			Help: "Connections open to each broker node, by role (consumer, publisher, parker, relay): which node a worker is on.",
		}, []string{"node", "role"}),
		nodeOpened: counter("broker_connections_total",
			"Connections opened to each broker node, by role; a rise on another node is a failover.", "node", "role"),
	}
	cols := []prometheus.Collector{
		m.received, m.redelivered, m.settled, m.inFlight, m.duplicates, m.lockOK, m.lockFailed,
		m.lockExpired, m.retries, m.inProcess, m.duration, m.conflicts, m.deadLettered, m.stale,
		m.settleErrors, m.handlerTime, m.critical, m.stuck, m.workersStale, m.redisDegraded, m.reconnects, m.connected,
		m.nodeConns, m.nodeOpened,
		m.breakerState, m.breakerTransitions, m.rateLimitWait,
	}
	if c.Inbox != nil {
		m.inbox = newInboxCollector(ns, c.ConstLabels, *c.Inbox)
		cols = append(cols, m.inbox)
	}
	for _, col := range cols {
		if err := reg.Register(col); err != nil {
			for _, done := range m.registeredOrder {
				reg.Unregister(done)
			}
			return nil, fmt.Errorf("metrics: register: %w", err)
		}
		m.registeredOrder = append(m.registeredOrder, col)
	}
	return m, nil
}

// Unregister removes every series of m from reg (the registerer given to
// [New]; nil means prometheus.DefaultRegisterer).
func (m *Metrics) Unregister(reg prometheus.Registerer) {
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	for _, c := range m.registeredOrder {
		reg.Unregister(c)
	}
}

// Init pre-initialises every series of one route (queue and consumer) with
// all its known label values (duplicate sources, retry and dead-letter
// reasons, conflict kinds, outcomes, actions, inbox statuses), so that a
// quiet system shows zeros rather than gaps and rate() works from the first
// event. Call it once per registered handler at startup.
func (m *Metrics) Init(queue, namespace string) {
	m.route(queue, namespace)
	m.stuck.WithLabelValues(queue, namespace)
	m.critical.WithLabelValues(queue, namespace)
	reasons := slices.Concat(knownReasons, m.extraReasons)
	for _, s := range knownSources {
		m.duplicates.WithLabelValues(queue, namespace, s)
	}
	for _, r := range reasons {
		m.retries.WithLabelValues(queue, namespace, r)
		m.inProcess.WithLabelValues(queue, namespace, r)
		m.deadLettered.WithLabelValues(queue, namespace, r)
	}
	for _, k := range knownKinds {
		m.conflicts.WithLabelValues(queue, namespace, k)
	}
	for _, o := range knownOutcomes {
		m.duration.WithLabelValues(queue, namespace, o)
	}
	for _, a := range knownActions {
		m.settled.WithLabelValues(queue, namespace, string(a))
		m.settleErrors.WithLabelValues(queue, namespace, string(a))
	}
	for _, k := range []retry.Kind{retry.KindSucceeded, retry.KindDuplicate, retry.KindRetry, retry.KindPermanent, retry.KindInterrupted} {
		m.handlerTime.WithLabelValues(queue, namespace, k.String())
	}
	m.stale.WithLabelValues(namespace)
	if m.inbox != nil {
		m.inbox.addConsumer(namespace)
	}
}

// InitHeld adds a strict ordered route's namespace to the held-key gauges,
// read with the inbox gauges (nothing without them).
func (m *Metrics) InitHeld(namespace string) {
	if m.inbox != nil {
		m.inbox.addHeld(namespace)
	}
}

func (m *Metrics) route(queue, namespace string) *routeSeries {
	k := routeKey{queue, namespace}
	if v, ok := m.perRoute.Load(k); ok {
		return v.(*routeSeries) //nolint:forcetypeassert // only *routeSeries is stored
	}
	rs := &routeSeries{
		received:    m.received.WithLabelValues(queue, namespace),
		redelivered: m.redelivered.WithLabelValues(queue, namespace),
		lockOK:      m.lockOK.WithLabelValues(queue, namespace),
		lockFailed:  m.lockFailed.WithLabelValues(queue, namespace),
		lockExpired: m.lockExpired.WithLabelValues(queue, namespace),
		inFlight:    m.inFlight.WithLabelValues(queue, namespace),
	}
	v, _ := m.perRoute.LoadOrStore(k, rs)
	return v.(*routeSeries) //nolint:forcetypeassert // only *routeSeries is stored
}

// OnTransition counts the transitions that have their own series: received
// (deliveries_received_total, in_flight, redelivered_total), locked,
// lock_failed and lock_expired. Duplicates, retries and dead letters are
// counted once per delivery in [Metrics.OnOutcome].
func (m *Metrics) OnTransition(d *inboxtype.Delivery, status inboxtype.Status, _ error) {
	switch status {
	case inboxtype.StatusReceived:
		rs := m.route(d.Queue, d.Namespace)
		rs.received.Inc()
		rs.inFlight.Inc()
		if d.Redelivered {
			rs.redelivered.Inc()
		}
	case inboxtype.StatusLocked:
		m.route(d.Queue, d.Namespace).lockOK.Inc()
	case inboxtype.StatusLockFailed:
		m.route(d.Queue, d.Namespace).lockFailed.Inc()
	case inboxtype.StatusLockExpired:
		m.route(d.Queue, d.Namespace).lockExpired.Inc()
	}
}

// OnOutcome counts how a delivery ended: deliveries_settled_total{action},
// job_processing_duration_seconds{outcome}, duplicate_detected_total{source},
// job_retry_total{reason} (broker-side retries), dead_lettered_total{reason},
// idempotency_conflict_total{kind} and settle_errors_total; it also takes
// the delivery out of in_flight. The processing time carries the
// delivery's TraceID as an exemplar when it has one.
func (m *Metrics) OnOutcome(d *inboxtype.Delivery, o inboxtype.Outcome) {
	q, c := d.Queue, d.Namespace
	m.route(q, c).inFlight.Dec()
	m.settled.WithLabelValues(q, c, string(o.Action)).Inc()
	if o.Err != nil {
		m.settleErrors.WithLabelValues(q, c, string(o.Action)).Inc()
	}
	observe(m.duration.WithLabelValues(q, c, outcomeOf(o)), o.Duration.Seconds(), d.TraceID)
	if o.Handled > 0 {
		observe(m.handlerTime.WithLabelValues(q, c, o.Decision.Kind.String()), o.Handled.Seconds(), d.TraceID)
	}
	if o.Action == inboxtype.ActionAcked && o.Decision.Kind == retry.KindSucceeded {
		if at, ok := publishedAt(d); ok {
			// The job's end to end: from its publication to its effect. A
			// producer's clock ahead of ours counts as 0.
			crit := d.ReceivedAt.Add(o.Duration).Sub(at)
			observe(m.critical.WithLabelValues(q, c), max(crit, 0).Seconds(), d.TraceID)
		}
	}

	dec := o.Decision
	switch {
	case dec.Kind == retry.KindDuplicate:
		src := dec.Source
		if src == "" {
			src = retry.SourceInbox
		}
		m.duplicates.WithLabelValues(q, c, src).Inc()
		if src == retry.SourceBusiness {
			m.conflicts.WithLabelValues(q, c, ConflictBusinessConstraint).Inc()
		}
	case dec.Reason == retry.ReasonKeyConflict || errors.Is(dec.Err, retry.ErrKeyConflict):
		m.conflicts.WithLabelValues(q, c, ConflictKeyConflict).Inc()
	}
	switch o.Action {
	case inboxtype.ActionRetried:
		m.retries.WithLabelValues(q, c, reasonOf(dec)).Inc()
	case inboxtype.ActionDeadLettered:
		m.deadLettered.WithLabelValues(q, c, reasonOf(dec)).Inc()
	}
}

// OnInProcessRetry counts an in-process retry in job_retry_total and
// in_process_retry_total.
func (m *Metrics) OnInProcessRetry(d *inboxtype.Delivery, dec retry.Decision, _ time.Duration) {
	r := reasonOf(dec)
	m.retries.WithLabelValues(d.Queue, d.Namespace, r).Inc()
	m.inProcess.WithLabelValues(d.Queue, d.Namespace, r).Inc()
}

// OnConnState sets broker_connected and counts broker_reconnects_total on
// every connection after the first.
func (m *Metrics) OnConnState(state inboxtype.ConnState, _ error) {
	switch state {
	case inboxtype.ConnConnected:
		m.connected.Set(1)
		if m.everConnected.Swap(true) {
			m.reconnects.Inc()
		}
	case inboxtype.ConnDisconnected, inboxtype.ConnStopped:
		m.connected.Set(0)
	}
}

// InitBrokerNodes pre-initialises broker_node_connections and
// broker_connections_total for role on every node (host:port), so that a
// node never connected to shows 0 rather than nothing. The roles inboxmq
// reports are "consumer" (the consuming connection), "publisher" (the
// consumer's connection for retry and dead-letter copies), "parker" and
// "relay" (an outbox relay lane).
func (m *Metrics) InitBrokerNodes(role string, nodes ...string) {
	for _, n := range nodes {
		m.nodeConns.WithLabelValues(n, role)
		m.nodeOpened.WithLabelValues(n, role)
	}
}

// BrokerNode records a broker connection of role opening (connected true:
// broker_connections_total and broker_node_connections go up) or closing
// (false: broker_node_connections goes down) on node (host:port). It fits
// the OnBrokerNode hooks of consumer.Config, relay.Config and
// controlrun.DialParkerOpts.
func (m *Metrics) BrokerNode(role, node string, connected bool) {
	if connected {
		m.nodeOpened.WithLabelValues(node, role).Inc()
		m.nodeConns.WithLabelValues(node, role).Inc()
		return
	}
	m.nodeConns.WithLabelValues(node, role).Dec()
}

// SetRedisDegraded sets redis_degraded: the lock and completed-cache hooks
// call it with true when Redis fails (and they fall back to PostgreSQL alone)
// and with false when it answers again. With several Redis users, give each
// its own hook from [Metrics.RedisDegradedHook] instead, so that one
// recovering does not clear the flag while another is still degraded.
func (m *Metrics) SetRedisDegraded(degraded bool) {
	m.setDegraded("", degraded)
}

// RedisDegradedHook returns an OnDegraded hook for one Redis user (such as
// "lock", "cache" or "ratelimit"): redis_degraded is 1 while any user is degraded.
func (m *Metrics) RedisDegradedHook(component string) func(degraded bool) {
	return func(degraded bool) { m.setDegraded(component, degraded) }
}

func (m *Metrics) setDegraded(component string, degraded bool) {
	m.degradedMu.Lock()
	defer m.degradedMu.Unlock()
	if m.degradedBy == nil {
		m.degradedBy = make(map[string]bool)
	}
	if degraded {
		m.degradedBy[component] = true
	} else {
		delete(m.degradedBy, component)
	}
	anyDegraded := len(m.degradedBy) > 0
	m.degraded.Store(anyDegraded)
	if anyDegraded {
		m.redisDegraded.Set(1)
	} else {
		m.redisDegraded.Set(0)
	}
}

// RedisDegraded reports whether any Redis user is degraded (false before
// any call). Readiness checks use it to flag, not fail.
func (m *Metrics) RedisDegraded() bool { return m.degraded.Load() }

// Breaker states: the values of breaker_state and the "to" label of
// breaker_transitions_total.
const (
	BreakerClosed   = 0
	BreakerHalfOpen = 1
	BreakerOpen     = 2
)

var breakerStateNames = [...]string{BreakerClosed: "closed", BreakerHalfOpen: "half_open", BreakerOpen: "open"}

// InitBreaker sets breaker_state{queue,downstream} to closed and
// pre-initialises its transitions, so that a breaker shows before its
// first transition. Call it once per guarded queue at startup.
func (m *Metrics) InitBreaker(queue, downstream string) {
	m.breakerState.WithLabelValues(queue, downstream).Set(BreakerClosed)
	for _, name := range breakerStateNames {
		m.breakerTransitions.WithLabelValues(queue, downstream, name)
	}
}

// BreakerTransition records a breaker guarding queue entering state (one of
// BreakerClosed, BreakerHalfOpen, BreakerOpen): it sets breaker_state and
// counts breaker_transitions_total. Another state is ignored.
func (m *Metrics) BreakerTransition(queue, downstream string, state int) {
	if state < 0 || state >= len(breakerStateNames) {
		return
	}
	m.breakerState.WithLabelValues(queue, downstream).Set(float64(state))
	m.breakerTransitions.WithLabelValues(queue, downstream, breakerStateNames[state]).Inc()
}

// RateLimitWaitHook returns an OnWait hook for the rate limit of
// downstream (middleware.RateLimitOpts.OnWait): each wait is observed in
// ratelimit_wait_seconds{downstream}. It initialises the series.
func (m *Metrics) RateLimitWaitHook(downstream string) func(time.Duration) {
	obs := m.rateLimitWait.WithLabelValues(downstream)
	return func(d time.Duration) { obs.Observe(d.Seconds()) }
}

// StaleRecords adds n to stale_processing_records_total{consumer}: the
// reconciler calls it with the number of claims it found past their lease.
// n <= 0 does nothing.
func (m *Metrics) StaleRecords(namespace string, n int) {
	if n <= 0 {
		return
	}
	m.stale.WithLabelValues(namespace).Add(float64(n))
}

// observe records v, with traceID as the exemplar's trace_id when there
// is one.
func observe(obs prometheus.Observer, v float64, traceID string) {
	if ex, ok := obs.(prometheus.ExemplarObserver); ok && traceID != "" {
		ex.ObserveWithExemplar(v, prometheus.Labels{"trace_id": traceID})
		return
	}
	obs.Observe(v)
}

func outcomeOf(o inboxtype.Outcome) string {
	switch o.Action {
	case inboxtype.ActionAcked:
		if o.Decision.Kind == retry.KindDuplicate {
			return OutcomeDuplicate
		}
		return OutcomeCompleted
	case inboxtype.ActionRetried:
		return OutcomeRetry
	case inboxtype.ActionDeadLettered:
		return OutcomeDeadLettered
	case inboxtype.ActionRequeued:
		return OutcomeRequeued
	default:
		return OutcomeAbandoned
	}
}

func reasonOf(dec retry.Decision) string {
	if dec.Reason != "" {
		return dec.Reason
	}
	if dec.Kind == retry.KindPermanent {
		return retry.ReasonPermanent
	}
	return retry.ReasonError
}

// HandlerStuck counts a handler of the route (queue, namespace) that
// outlived its context (stuck) or, later, returned (!stuck): the
// handlers_stuck gauge.
func (m *Metrics) HandlerStuck(queue, namespace string, stuck bool) {
	if stuck {
		m.stuck.WithLabelValues(queue, namespace).Inc()
		return
	}
	m.stuck.WithLabelValues(queue, namespace).Dec()
}

// SetWorkersStale sets the workers_stale gauge: how many other workers
// stopped refreshing their presence.
func (m *Metrics) SetWorkersStale(n int) { m.workersStale.Set(float64(n)) }
