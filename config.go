package inboxmq

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/internal/amqpdial"
	"github.com/inboxmq/inboxmq/metrics"
	"github.com/inboxmq/inboxmq/middleware"
	"github.com/inboxmq/inboxmq/observe"
	"github.com/inboxmq/inboxmq/outbox"
)

// Defaults of [Config].
const (
	// DefaultConnectTimeout bounds each wait for PostgreSQL and RabbitMQ in
	// Worker.Start when Config.ConnectTimeout is zero.
	DefaultConnectTimeout = 30 * time.Second
	// DefaultHandlerTimeout bounds one delivery's handling when
	// Config.HandlerTimeout is zero.
	DefaultHandlerTimeout = time.Minute
	// DefaultStopTimeout bounds Worker.Stop when Config.StopTimeout is zero
	// and the context has no earlier deadline.
	DefaultStopTimeout = 25 * time.Second
	// DefaultStallThreshold is HealthConfig.StallThreshold's floor when it
	// is zero: how long the consumer may hold deliveries without settling
	// any before /healthz fails.
	DefaultStallThreshold = 5 * time.Minute
)

// Config configures a [Worker]. URL, DB and Routes are required; every
// other field has a default. The runtime controls are on unless
// Controls.Disabled; each other nil section (Metrics, Health, Outbox,
// Reconciler, Retention) leaves its part out. A Config must not be
// changed after it is passed to [NewWorker].
type Config struct {
	// URL is the broker's amqp:// or amqps:// URL, or the URLs of a
	// cluster's nodes separated by commas. Required. The consumer, its
	// publisher of retry and dead-letter copies, the parker and the outbox
	// relay each connect to one node that answers and, when that
	// connection is lost, to a node that answers then (see consumer.Config.URL);
	// the node of every connection is logged and, with Metrics, counted in
	// broker_node_connections{node,role}. Credentials in it never appear
	// in logs or errors.
	URL string

	// DB is the pool on the PostgreSQL primary that holds the inbox (run
	// package migrations first). Required. The worker never closes it.
	// Build it through [inbox.ConfigurePool] so that connections opened
	// after start-up, and after a fail-over, reach the writable primary
	// of a multi-host URL and never a standby or a fenced old primary.
	DB *pgxpool.Pool

	// Redis is the client of the completed-cache and the lock. Defaults to
	// nil: no cache and no lock, PostgreSQL alone deduplicates (the
	// guarantees do not depend on Redis). Build it with
	// ContextTimeoutEnabled so call timeouts bound socket reads, as
	// [RedisFromURL] does for a single server, Sentinel or Cluster. The
	// worker never closes it.
	Redis redis.UniversalClient

	// Routes are the handlers, built with [NewRoutes], [HandleTx] and
	// [HandleClaim]. Required, with at least one route.
	Routes *Routes

	// Name identifies this worker process to the broker (connection_name),
	// in logs (worker_id) and in its presence row (inboxctl workers), so
	// give each process a name of its own. Defaults to "<hostname>-<pid>".
	Name string

	// Logger receives the worker's logs: start-up waits, connection events,
	// one line per delivery transition, the background services' findings.
	// Any slog handler works (slog's own, or zap's or zerolog's through
	// their slog adapters). Defaults to nil, which means no logging.
	Logger *slog.Logger

	// ConnectTimeout bounds each wait for a service in Start (PostgreSQL
	// for the inbox and the controls, RabbitMQ for the exchanges and the
	// consumer) and each broker dial. Past it Start fails with a
	// [*StartTimeoutError] naming the service. Defaults to
	// DefaultConnectTimeout (30s).
	ConnectTimeout time.Duration

	// HandlerTimeout bounds one delivery's handling (middleware, inbox and
	// handler); past it the handler's context ends and the delivery is
	// retried. Defaults to DefaultHandlerTimeout (1m); -1 means no bound.
	HandlerTimeout time.Duration

	// StopTimeout bounds the whole of Stop: the consumer's graceful stop
	// and then every background service. Defaults to DefaultStopTimeout
	// (25s); a Stop context with an earlier deadline wins.
	StopTimeout time.Duration

	// Metrics registers the Prometheus series and counts every delivery.
	// Defaults to nil: no metrics.
	Metrics *MetricsConfig

	// Health serves /metrics, /healthz and /readyz. Defaults to nil: no
	// listener.
	Health *HealthConfig

	// Controls configures how the worker obeys inboxctl and the console:
	// pause, resume, concurrency, and blocked keys parked in
	// "<queue>.parked". Defaults to nil: controls on, with
	// ControlsConfig's defaults; ControlsConfig.Disabled turns them off.
	Controls *ControlsConfig

	// Outbox runs a relay that publishes the rows handlers enqueue with
	// outbox.Enqueue. Defaults to nil: no relay.
	Outbox *OutboxConfig

	// Reconciler runs inbox.Reconciler: claims of vanished workers past
	// their lease become retryable. Its OnStale defaults to the metrics'
	// stale_processing_records_total and its Logger to Logger. Defaults to
	// nil: no reconciler (a zero inbox.ReconcilerConfig runs it with its
	// defaults).
	Reconciler *inbox.ReconcilerConfig

	// Retention runs inbox.Retention: completed rows past the dedup window
	// are deleted. Defaults to nil: no retention job (a zero
	// inbox.RetentionConfig runs it with its defaults). A partitioned inbox
	// table (migrations.PartitionInbox) needs it, to create the partitions
	// ahead and drop the old ones: Start refuses one without it.
	Retention *inbox.RetentionConfig

	// Inbox configures the store the worker builds on DB. Its Logger
	// defaults to Logger. Defaults to nil: the store's defaults.
	Inbox *inbox.StoreConfig

	// Tracing configures the worker's OpenTelemetry spans. Defaults to
	// nil, which is a zero TracingConfig: traces are exported when the
	// standard OTEL_* environment asks for it, and cost nothing otherwise.
	Tracing *TracingConfig
}

// TracingConfig configures the worker's spans: one consumer span per
// delivery (middleware.Tracing), the inbox's spans below it, and one
// producer span per row the outbox relay publishes. docs/observability.md
// lists what each carries.
type TracingConfig struct {
	// TracerProvider makes the spans. Defaults to nil: when the
	// environment asks for traces ([observe.TracingConfigured]:
	// OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
	// OTEL_TRACES_EXPORTER), NewWorker builds an SDK provider from it
	// ([observe.NewTracerProvider]: exporter, service name, resource
	// attributes and sampler all from OTEL_*), and Stop flushes and shuts
	// it down once every part has stopped; otherwise
	// otel.GetTracerProvider(), a no-op until the program installs one,
	// and spans that do not record cost the delivery path next to nothing.
	// A provider set here is the caller's to shut down.
	TracerProvider trace.TracerProvider
	// ServiceName is the service.name of a provider built from the
	// environment when neither OTEL_SERVICE_NAME nor
	// OTEL_RESOURCE_ATTRIBUTES names one. Defaults to the SDK's
	// unknown_service:<executable>.
	ServiceName string
	// Opts configures the consumer spans: the propagator that reads the
	// parent from the headers, and whether the idempotency key is an
	// attribute. Defaults to nil: middleware.TracingOpts's defaults.
	Opts *middleware.TracingOpts
}

// MetricsConfig configures the worker's Prometheus metrics.
type MetricsConfig struct {
	// Registerer registers the series (the consumer's, the inbox gauges
	// and the relay's). Defaults to prometheus.DefaultRegisterer.
	Registerer prometheus.Registerer
	// Gatherer is served on /metrics when Health is set. Defaults to
	// Registerer when it is a prometheus.Gatherer (a *prometheus.Registry),
	// otherwise prometheus.DefaultGatherer.
	Gatherer prometheus.Gatherer
	// Series configures the series: namespace, labels, buckets, extra
	// reasons. Its Inbox defaults to the inbox gauges read through DB.
	// Defaults to nil: metrics.New's defaults with the inbox gauges.
	Series *metrics.Config
}

// HealthConfig configures the worker's HTTP listener: /metrics (when
// Metrics is set), /healthz (liveness) and /readyz (readiness). Both answer
// 200 or 503 with a JSON body naming each check, and for a failing one its
// error, since when it fails and its threshold.
//
// /healthz has the check "consumer", a watchdog: it fails while the
// consumer holds deliveries (handling or settling them) and has settled
// none for longer than StallThreshold — a stuck handler, settlement or
// consume loop that only a restart cures. An idle or paused worker never
// fails it. /readyz has the checks "startup" (fails, naming what Start
// waits for, until the worker consumes, and again once it stops), "broker"
// (the consumer is connected and consumes), "database" (DB answers a ping)
// and, with Redis, the non-fatal "redis" (degraded while the cache or the
// lock bypasses Redis).
type HealthConfig struct {
	// Addr is the listen address. Defaults to observe.DefaultAddr
	// (loopback).
	Addr string
	// Checks are further /readyz checks. Defaults to none.
	Checks []observe.Check
	// Liveness are further /healthz checks. Defaults to none.
	Liveness []observe.Check
	// StallThreshold is how long the consumer may hold deliveries without
	// settling any before /healthz fails. Keep it above the longest a
	// delivery may legitimately take. Defaults to DefaultStallThreshold
	// (5m), or HandlerTimeout plus one minute when that is longer; -1
	// disables the watchdog (with HandlerTimeout -1, only a threshold set
	// here enables it).
	StallThreshold time.Duration
}

// ControlsConfig configures the runtime controls: a control.Watcher that
// applies inboxctl's pause and concurrency to the consumer, and a
// middleware.Block on every route that parks the deliveries of blocked keys
// through a control.DialParker. The watcher holds one pool connection in
// LISTEN and reads the controls once per PollInterval.
//
// Whether the controls are on or off, the worker announces itself in
// PostgreSQL (control.Heartbeat: its name, host, pid, namespaces, version
// and whether it obeys the controls), so that inboxctl and the console
// count the live workers a change reaches.
type ControlsConfig struct {
	// Disabled turns the controls off: the worker ignores pause,
	// concurrency and blocks, and says so in its presence row. Defaults
	// to false.
	Disabled bool
	// PollInterval is the watcher's reload period without a notification.
	// Defaults to control.DefaultPollInterval.
	PollInterval time.Duration
	// NoListen makes the watcher poll only (no LISTEN connection).
	// Defaults to false.
	NoListen bool
	// ParkerName is the connection_name of the parker's broker connection.
	// Defaults to Name + "-parker".
	ParkerName string
}

// OutboxConfig configures the outbox relay.
type OutboxConfig struct {
	// Relay configures the relay. Its URL defaults to Config.URL, its
	// Logger to Config.Logger and its Registerer to the metrics' (or, with
	// no Metrics, a registry of its own that nothing serves). Defaults to
	// outbox.RelayConfig's zero value.
	Relay outbox.RelayConfig
	// Exchanges are declared (durable) in Start before the relay runs, so
	// that the first publish finds them. Defaults to none.
	Exchanges []Exchange
}

// Exchange is an exchange the worker declares at start: durable, not
// auto-deleted.
type Exchange struct {
	// Name is the exchange's name. Required.
	Name string
	// Kind is its type (topic, direct, fanout, headers). Defaults to
	// "topic".
	Kind string
}

// settings is a Config with its defaults applied.
type settings struct {
	Config
	gatherer prometheus.Gatherer
}

// withDefaults returns cfg with its defaults applied, or the first reason
// it is invalid. It does no I/O.
func withDefaults(cfg *Config) (*settings, error) {
	if cfg == nil {
		return nil, errors.New("inboxmq: nil Config")
	}
	s := &settings{Config: *cfg}
	if s.URL == "" {
		return nil, errors.New("inboxmq: Config.URL is required")
	}
	if _, err := amqpdial.Parse(s.URL); err != nil {
		return nil, fmt.Errorf("inboxmq: Config.URL: want an amqp:// or amqps:// URL, or a comma-separated list of them: %w", err)
	}
	if s.DB == nil {
		return nil, errors.New("inboxmq: Config.DB is required")
	}
	if s.Routes == nil || len(s.Routes.snapshot()) == 0 {
		return nil, errors.New("inboxmq: Config.Routes needs at least one route")
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
		off  bool // -1 allowed
	}{
		{"ConnectTimeout", &s.ConnectTimeout, DefaultConnectTimeout, false},
		{"HandlerTimeout", &s.HandlerTimeout, DefaultHandlerTimeout, true},
		{"StopTimeout", &s.StopTimeout, DefaultStopTimeout, false},
	} {
		switch {
		case *d.v == 0:
			*d.v = d.def
		case *d.v == -1 && d.off:
		case *d.v < 0:
			return nil, fmt.Errorf("inboxmq: Config.%s %s: want a positive duration", d.name, *d.v)
		}
	}
	if m := s.Metrics; m != nil {
		mc := *m
		if mc.Registerer == nil {
			mc.Registerer = prometheus.DefaultRegisterer
		}
		if mc.Gatherer == nil {
			mc.Gatherer = prometheus.DefaultGatherer
			if g, ok := mc.Registerer.(prometheus.Gatherer); ok {
				mc.Gatherer = g
			}
		}
		s.Metrics = &mc
		s.gatherer = mc.Gatherer
	}
	if h := s.Health; h != nil {
		hc := *h
		switch {
		case hc.StallThreshold == 0 && s.HandlerTimeout == -1:
			hc.StallThreshold = -1 // handlers may run for ever: no bound to watch
		case hc.StallThreshold == 0:
			hc.StallThreshold = max(DefaultStallThreshold, s.HandlerTimeout+time.Minute)
		case hc.StallThreshold < 0 && hc.StallThreshold != -1:
			return nil, fmt.Errorf("inboxmq: Config.Health.StallThreshold %s: want a positive duration or -1", hc.StallThreshold)
		}
		s.Health = &hc
	}
	if o := s.Outbox; o != nil {
		for _, e := range o.Exchanges {
			if e.Name == "" {
				return nil, errors.New("inboxmq: Config.Outbox.Exchanges: an exchange without a Name")
			}
			switch e.Kind {
			case "", "topic", "direct", "fanout", "headers":
			default:
				return nil, fmt.Errorf("inboxmq: Config.Outbox.Exchanges: exchange %q: unknown kind %q", e.Name, e.Kind)
			}
		}
	}
	if r := s.Retention; r != nil {
		if err := inbox.CheckWindow(cmp.Or(r.Window, inbox.DefaultRetentionWindow), r.RedeliveryHorizon); err != nil {
			return nil, fmt.Errorf("inboxmq: Config.Retention: %w", err)
		}
	}
	return s, nil
}
