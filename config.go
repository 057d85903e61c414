package inboxmq

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/internal/amqpdial"
	"github.com/inboxmq/inboxmq/internal/consumer"
)

// Config configures a [Worker]. URL and DB are required. Every
// other field has a default that serves a production worker: logs, metrics,
// runtime controls, the outbox relay, the reconciler and retention are on
// unless a field turns them off. A Config must not be changed after it is
// passed to [NewWorker].
type Config struct {
	// URL is the broker's amqp:// or amqps:// URL, or the URLs of a
	// cluster's nodes separated by commas: each connection goes to a node
	// that answers and moves to another when its node goes away.
	// Credentials in it never appear in logs or errors. Required.
	URL string

	// DB is the pool on the PostgreSQL primary that holds the inbox (apply
	// package migrations first). Build it through [inbox.ConfigurePool] so
	// that connections opened after a fail-over reach the new primary. The
	// worker never closes it. Required.
	DB *pgxpool.Pool

	// Routes are the handlers, built with [NewRoutes] and [HandleTx],
	// [HandleBatch] or [HandleClaim]. Defaults to none: a worker without
	// routes consumes nothing and runs the outbox relay, for a service
	// that only enqueues (outbox.Enqueue in its own transactions).
	Routes *Routes

	// Redis is the client of the completed-cache in front of the inbox, of
	// the lock of routes that take one ([RouteOpts.Lock]) and of the rate
	// limits shared by workers ([RouteOpts.RateLimit]); build it with
	// [RedisFromURL]. The guarantees never depend on it. The worker never
	// closes it. Defaults to nil: no cache, no lock, rate limits kept per
	// worker.
	Redis redis.UniversalClient

	// Name identifies this worker process: to the broker
	// (connection_name), in logs (worker) and in its presence row
	// (inboxctl workers). Give each process its own. Defaults to
	// "<hostname>-<pid>".
	Name string

	// Logger receives the worker's logs: start-up waits, connection
	// events, a line for each transition of each delivery, and the
	// background services' findings. Defaults to slog.Default().
	Logger *slog.Logger

	// Registerer registers the worker's Prometheus series. When it is also
	// a prometheus.Gatherer (a *prometheus.Registry is), Addr serves it at
	// /metrics. Defaults to a registry of the worker's own, which also
	// holds the Go runtime's and the process's series (go_*, process_*).
	Registerer prometheus.Registerer

	// Addr is the listen address of /metrics, /healthz (liveness: fails
	// when the consumer holds deliveries and has settled none for longer
	// than StallThreshold, or when handlers that outlived their
	// HandlerTimeout hold every slot of a route: a stuck worker that only a
	// restart cures) and
	// /readyz (readiness: start-up done, broker consuming, database
	// answering, Redis degraded or not). Each answers 200 or 503 with a
	// JSON body naming each check, and for a failing one its error, since
	// when, and its threshold. Defaults to "": no listener.
	Addr string

	// ManagementURL is RabbitMQ's management API, which the worker's
	// start-up topology lint reads: the routes' queues, their arguments
	// and the policies on them, checked for what silently loses or loops
	// messages (logged at error; inboxctl lint runs the same checks).
	// Defaults to the first broker node's host on port 15672 (15671 for
	// amqps://) with the broker URL's credentials; when it does not
	// answer, the lint is skipped with a line at info.
	ManagementURL string

	// TracerProvider makes the worker's spans: one per delivery (its
	// parent read from the message's headers), the inbox's below it, and
	// one per message the outbox relay publishes. Defaults to
	// otel.GetTracerProvider(), a no-op until the program installs one.
	TracerProvider trace.TracerProvider

	// ConnectTimeout bounds each wait for PostgreSQL or RabbitMQ in
	// [Worker.Start] and each broker dial. Past it Start fails with a
	// [*StartTimeoutError] naming the service. Defaults to 30s.
	ConnectTimeout time.Duration

	// HandlerTimeout bounds one delivery's handling (middleware, inbox and
	// handler): past it the handler's context ends and the delivery is
	// retried. A handler still running a quarter of HandlerTimeout (at
	// most 10s) after its context ended ignores the cancellation: it is
	// logged at error with its key and counted in inboxmq_handlers_stuck
	// until it returns. Defaults to 1m; -1 means no bound.
	HandlerTimeout time.Duration

	// StopTimeout bounds the whole of [Worker.Stop]. Defaults to 25s; a
	// Stop context with an earlier deadline wins.
	StopTimeout time.Duration

	// StallThreshold is how long the consumer may hold deliveries without
	// settling any before /healthz fails; keep it above the longest a
	// delivery may legitimately take. An idle or paused worker never
	// fails. Defaults to HandlerTimeout plus a minute, at least 5m (with
	// no HandlerTimeout, no watchdog); -1 turns the watchdog off.
	StallThreshold time.Duration

	// Table is the inbox table, optionally schema-qualified ("app.inbox").
	// Defaults to "inboxmq_inbox", resolved through the pool's
	// search_path.
	Table string

	// RetentionWindow is how long completed inbox rows are kept, the
	// dedup window: a copy of a message arriving after its row was
	// deleted would run again. Defaults to the longest redelivery horizon
	// of the routes (their last retry's delay times their attempts, plus a
	// week for replays from the DLQ), which Start logs; a shorter window
	// than that horizon is refused. -1 turns retention off (a partitioned
	// inbox then cannot start: retention creates its partitions).
	RetentionWindow time.Duration

	// ReconcileInterval is how often the reconciler looks for claims whose
	// worker vanished (claim mode) and makes them safe to retry. Defaults
	// to 1m; -1 turns the reconciler off.
	ReconcileInterval time.Duration

	// Exchanges are declared (durable, topic) by Start before anything is
	// consumed, so that the first message a handler enqueues in the
	// outbox, or a fault event, finds its exchange. Defaults to none.
	Exchanges []string

	// DropUnroutable makes the outbox relay drop a message no queue is
	// bound to take (an event nobody subscribed to), logging it, instead
	// of keeping it and trying again with backoff. Defaults to false.
	DropUnroutable bool

	// DisableControls turns off the runtime controls: the worker no longer
	// obeys inboxctl's pause, concurrency and blocked keys (its presence
	// row says so, and inboxctl warns). Defaults to false: controls on.
	DisableControls bool

	// DisableRelay turns off the outbox relay: rows that handlers enqueue
	// wait for a relay running elsewhere. Defaults to false: the worker
	// publishes them.
	DisableRelay bool
}

// Defaults of [Config].
const (
	defaultConnectTimeout    = 30 * time.Second
	defaultHandlerTimeout    = time.Minute
	defaultStopTimeout       = 25 * time.Second
	defaultStallThreshold    = 5 * time.Minute
	defaultReconcileInterval = time.Minute
	// replayWindow is how long after its dead-lettering an operator may
	// replay a message: part of every route's redelivery horizon.
	replayWindow = 7 * 24 * time.Hour
)

// settings is a Config with its defaults applied.
type settings struct {
	Config
	// gatherer serves /metrics (nil: the registerer cannot be gathered).
	gatherer prometheus.Gatherer
}

// withDefaults returns cfg with its defaults applied, or the first reason
// it is invalid. It does no I/O.
func withDefaults(cfg *Config) (*settings, error) {
	if cfg == nil {
		return nil, errors.New("inboxmq: nil Config")
	}
	s := &settings{Config: *cfg}
	switch {
	case s.URL == "":
		return nil, errors.New("inboxmq: Config.URL is required")
	case s.DB == nil:
		return nil, errors.New("inboxmq: Config.DB is required")
	case len(s.Routes.snapshot()) == 0 && s.DisableRelay:
		return nil, errors.New("inboxmq: a Config without Routes and with DisableRelay has nothing to run")
	}
	if _, err := amqpdial.Parse(s.URL); err != nil {
		return nil, fmt.Errorf("inboxmq: Config.URL: want an amqp:// or amqps:// URL, or a comma-separated list of them: %w", err)
	}
	s.Name = cmp.Or(s.Name, hostPID())
	if s.Logger == nil {
		s.Logger = slog.Default()
	}
	if s.Registerer == nil {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		s.Registerer = reg
	}
	s.gatherer, _ = s.Registerer.(prometheus.Gatherer)
	if s.TracerProvider == nil {
		s.TracerProvider = otel.GetTracerProvider()
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
		off  bool // -1 allowed
	}{
		{"ConnectTimeout", &s.ConnectTimeout, defaultConnectTimeout, false},
		{"HandlerTimeout", &s.HandlerTimeout, defaultHandlerTimeout, true},
		{"StopTimeout", &s.StopTimeout, defaultStopTimeout, false},
		{"ReconcileInterval", &s.ReconcileInterval, defaultReconcileInterval, true},
		{"RetentionWindow", &s.RetentionWindow, 0, true}, // derived from the routes (retentionWindow)
	} {
		switch {
		case *d.v == 0:
			*d.v = d.def
		case *d.v == -1 && d.off:
		case *d.v < 0 && d.off:
			return nil, fmt.Errorf("inboxmq: Config.%s %s: want a positive duration, or -1", d.name, *d.v)
		case *d.v < 0:
			return nil, fmt.Errorf("inboxmq: Config.%s %s: want a positive duration", d.name, *d.v)
		}
	}
	switch {
	case s.StallThreshold == 0 && s.HandlerTimeout == -1:
		s.StallThreshold = -1 // handlers may run for ever: no bound to watch
	case s.StallThreshold == 0:
		s.StallThreshold = max(defaultStallThreshold, s.HandlerTimeout+time.Minute)
	case s.StallThreshold < 0 && s.StallThreshold != -1:
		return nil, fmt.Errorf("inboxmq: Config.StallThreshold %s: want a positive duration, or -1", s.StallThreshold)
	}
	for _, e := range s.Exchanges {
		if !consumer.ValidName(e) || e == "" {
			return nil, fmt.Errorf("inboxmq: Config.Exchanges: invalid exchange name %q", e)
		}
	}
	return s, nil
}

// retentionWindow returns the window of the retention job (0: off) and,
// when it was derived, why: the longest redelivery horizon of the routes.
// A window set shorter than that horizon is refused.
func (s *settings) retentionWindow(routes []*route) (time.Duration, string, error) {
	if s.RetentionWindow == -1 {
		return 0, "", nil
	}
	horizon, why := replayWindow, "a week for replays from the DLQ"
	for _, rt := range routes {
		tiers := rt.queueOpts().RetryTiers
		last := tiers[len(tiers)-1]
		attempts := 0
		if a, ok := rt.policy().(interface{ Attempts() int }); ok {
			attempts = a.Attempts()
		}
		if h := inbox.RedeliveryHorizon(last, attempts, replayWindow); h > horizon {
			horizon = h
			why = fmt.Sprintf("route %s: %d attempts × %s, plus a week for replays from the DLQ", rt.queue, attempts, last)
		}
	}
	if s.RetentionWindow == 0 {
		return horizon, why, nil
	}
	if err := inbox.CheckWindow(s.RetentionWindow, horizon); err != nil {
		return 0, "", fmt.Errorf("inboxmq: Config.RetentionWindow: %w (%s)", err, why)
	}
	return s.RetentionWindow, "", nil
}
