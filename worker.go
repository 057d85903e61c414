package inboxmq

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqpdial"
	"github.com/inboxmq/inboxmq/metrics"
	"github.com/inboxmq/inboxmq/middleware"
	"github.com/inboxmq/inboxmq/observe"
	"github.com/inboxmq/inboxmq/outbox"
	"github.com/inboxmq/inboxmq/retry"
)

// Worker runs the routes of a [Config] and owns the lifecycle of
// everything they need: the consumer, the inbox store, the runtime
// controls (unless disabled), its presence row for inboxctl, and the
// optional metrics, health listener, outbox relay, reconciler and
// retention job. Build it with [NewWorker], then [Worker.Run], or
// [Worker.Start] and [Worker.Stop]. A Worker starts once; its methods are
// safe for concurrent use.
type Worker struct {
	s       *settings
	logger  *slog.Logger
	st      *startup
	routes  []*route
	binds   []func(*inbox.Store)
	cons    *consumer.Consumer
	metrics *metrics.Metrics
	watcher *control.Watcher
	parker  *control.DialParker
	relay   *outbox.Relay
	health  *observe.Server
	dead    lateObserver
	tp      trace.TracerProvider     // the spans' provider
	ownTP   *sdktrace.TracerProvider // built from the environment: Stop shuts it down
	// breakers by downstream, and the reporter that publishes their states
	// for inboxctl (with the controls on).
	breakers map[string]*middleware.Breaker
	reporter *control.BreakerReporter
	// presence announces the worker for inboxctl, controls on or off.
	presence *control.Heartbeat

	storeRef  atomic.Pointer[inbox.Store]
	cacheDown atomic.Bool
	lockDown  atomic.Bool
	limitDown atomic.Bool
	stopping  atomic.Bool

	mu      sync.Mutex // held by Start and Stop for their whole run
	state   int
	running map[string]service
	stopErr error
	stopped chan struct{}
}

const (
	stateNew = iota
	stateStarted
	stateStopped
)

// The worker's parts in the order Stop stops them: the consumer first
// (in-flight deliveries finish, the rest are requeued), then the relay (so
// it can still publish what the last commits enqueued), then the rest.
// The presence row is marked stopped once the consumer has stopped.
var stopOrder = []string{"consumer", "presence", "relay", "controls", "breakers", "reconciler", "retention", "health"}

// NewWorker validates cfg and builds a worker ready to start. It does no
// I/O: a bad Config, a bad RouteOpts or a route whose payload has no
// idempotency key is reported here, each error naming what is wrong.
// With Config.Metrics it registers the series.
func NewWorker(cfg *Config) (*Worker, error) {
	s, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	w := &Worker{
		s:       s,
		logger:  s.Logger,
		st:      newStartup(s.Logger, s.ConnectTimeout),
		routes:  s.Routes.snapshot(),
		running: make(map[string]service),
		stopped: make(chan struct{}),
	}
	var errs []error
	for _, rt := range w.routes {
		errs = append(errs, rt.err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := w.buildTracing(); err != nil {
		return nil, err
	}
	var reg prometheus.Registerer = prometheus.NewRegistry() // the relay's, when nothing serves metrics
	if mc := s.Metrics; mc != nil {
		reg = mc.Registerer
		var series metrics.Config
		if mc.Series != nil {
			series = *mc.Series
		}
		if series.Inbox == nil {
			ic := &metrics.InboxConfig{DB: s.DB}
			if s.Inbox != nil {
				ic.Table = s.Inbox.Table
			}
			series.Inbox = ic
		}
		if w.metrics, err = metrics.New(mc.Registerer, &series); err != nil {
			return nil, fmt.Errorf("inboxmq: metrics: %w", err)
		}
	}
	if err := w.buildControls(); err != nil {
		return nil, w.unregister(err)
	}
	router, err := w.buildRouter()
	if err != nil {
		return nil, w.unregister(err)
	}
	w.presence = control.NewHeartbeat(s.DB, w.presenceRow(), s.Logger)
	observers := []inboxtype.Observer{middleware.NewLogObserver(s.Logger, nil), &w.dead}
	if w.metrics != nil {
		observers = append([]inboxtype.Observer{w.metrics}, observers...)
	}
	w.cons, err = consumer.New(&consumer.Config{
		URL:          s.URL,
		Name:         s.Name,
		Router:       router,
		Logger:       s.Logger,
		Observers:    observers,
		DialTimeout:  s.ConnectTimeout,
		OnBrokerNode: w.brokerNodeHook(s.URL, amqpdial.RoleConsumer, amqpdial.RolePublisher),
	})
	if err != nil {
		return nil, w.unregister(err)
	}
	if o := s.Outbox; o != nil {
		rc := o.Relay
		rc.URL = cmp.Or(rc.URL, s.URL)
		if rc.Logger == nil {
			rc.Logger = s.Logger
		}
		if rc.Registerer == nil {
			rc.Registerer = reg
		}
		if rc.OnBrokerNode == nil {
			rc.OnBrokerNode = w.brokerNodeHook(rc.URL, amqpdial.RoleRelay)
		}
		if rc.TracerProvider == nil {
			rc.TracerProvider = w.tp
		}
		if w.relay, err = outbox.NewRelay(s.DB, &rc); err != nil {
			return nil, w.unregister(err)
		}
	}
	if h := s.Health; h != nil {
		w.health = observe.NewServer(&observe.ServerConfig{
			Addr:     h.Addr,
			Gatherer: cmp.Or[prometheus.Gatherer](s.gatherer, prometheus.NewRegistry()),
			Checks:   append(w.checks(), h.Checks...),
			Liveness: append(w.liveness(h.StallThreshold), h.Liveness...),
		})
	}
	return w, nil
}

// unregister undoes the metrics registration of a NewWorker that failed
// after it, so that a corrected Config can register again, and drops a
// tracer provider it built.
func (w *Worker) unregister(err error) error {
	if w.metrics != nil {
		w.metrics.Unregister(w.s.Metrics.Registerer)
	}
	if w.ownTP != nil {
		_ = w.ownTP.Shutdown(context.Background()) // nothing exported yet
	}
	return err
}

// buildTracing picks the spans' provider: Config.Tracing's, one built from
// the environment, or the global one (see TracingConfig.TracerProvider).
func (w *Worker) buildTracing() error {
	var tc TracingConfig
	if w.s.Tracing != nil {
		tc = *w.s.Tracing
	}
	w.tp = tc.TracerProvider
	if w.tp != nil {
		return nil
	}
	if !observe.TracingConfigured() {
		w.tp = otel.GetTracerProvider()
		return nil
	}
	tp, err := observe.NewTracerProvider(context.Background(), tc.ServiceName)
	if err != nil {
		return fmt.Errorf("inboxmq: tracing: %w", err)
	}
	w.tp, w.ownTP = tp, tp
	return nil
}

// buildControls builds the watcher (its target is the consumer, built
// later: consumerTarget bridges the two) and the parker, unless the
// controls are disabled.
func (w *Worker) buildControls() error {
	var c ControlsConfig
	if w.s.Controls != nil {
		c = *w.s.Controls
	}
	if c.Disabled {
		return nil
	}
	queues := make(map[string]string, len(w.routes))
	for _, rt := range w.routes {
		queues[rt.namespace()] = rt.queue
	}
	var err error
	w.watcher, err = control.NewWatcher(w.s.DB, &control.WatcherConfig{
		Target:       consumerTarget{w},
		Queues:       queues,
		PollInterval: c.PollInterval,
		NoListen:     c.NoListen,
		Logger:       w.logger,
	})
	if err != nil {
		return err
	}
	name := c.ParkerName
	if name == "" && w.s.Name != "" {
		name = w.s.Name + "-parker"
	}
	w.parker = control.NewDialParker(w.s.URL, &control.DialParkerOpts{
		ConnectionName: name, DialTimeout: w.s.ConnectTimeout, Logger: w.logger,
		OnBrokerNode: w.brokerNodeHook(w.s.URL, amqpdial.RoleParker),
	})
	return nil
}

// presenceRow is what the worker announces: its name, where it runs, the
// namespaces of its routes and whether it obeys the controls.
func (w *Worker) presenceRow() control.Presence {
	host, _ := os.Hostname()
	var namespaces []string
	for _, rt := range w.routes {
		if ns := rt.namespace(); !slices.Contains(namespaces, ns) {
			namespaces = append(namespaces, ns)
		}
	}
	slices.Sort(namespaces)
	return control.Presence{
		ID: cmp.Or(w.s.Name, hostPID()), Host: host, PID: os.Getpid(),
		Namespaces: namespaces, Version: Version, Controls: w.watcher != nil,
	}
}

// brokerNodeHook returns the OnBrokerNode hook of a part connecting to
// rawURL's nodes (nil without metrics), its series pre-initialised for
// each role.
func (w *Worker) brokerNodeHook(rawURL string, roles ...string) func(role, node string, connected bool) {
	if w.metrics == nil {
		return nil
	}
	nodes, err := amqpdial.Parse(rawURL)
	if err != nil {
		return nil // the part's own validation reports it
	}
	for _, role := range roles {
		for _, n := range nodes {
			w.metrics.InitBrokerNodes(role, n.Addr)
		}
	}
	return w.metrics.BrokerNode
}

// buildRouter mounts the router-wide middleware and every route with its
// block, cache and lock middleware.
func (w *Worker) buildRouter() (*consumer.Router, error) {
	router := consumer.NewRouter()
	// Outermost first: a span per delivery (trace context from the
	// headers), handler timing, a bound on a stuck handler. Panics become
	// errors in the consumer's last guard, around the whole chain.
	var topts *middleware.TracingOpts
	if w.s.Tracing != nil {
		topts = w.s.Tracing.Opts
	}
	router.Use(middleware.Tracing(w.tp, topts))
	if w.metrics != nil {
		router.Use(middleware.Metrics(w.metrics))
	}
	router.Use(middleware.Timeout(w.s.HandlerTimeout))

	var block inboxtype.Middleware
	if w.watcher != nil {
		var err error
		if block, err = middleware.Block(w.watcher, w.parker, &middleware.BlockOpts{Logger: w.logger}); err != nil {
			return nil, err
		}
	}
	for _, rt := range w.routes {
		mw, err := w.routeMiddleware(rt, block)
		if err != nil {
			return nil, fmt.Errorf("inboxmq: route %q: %w", rt.queue, err)
		}
		onDead, err := w.faultHook(rt)
		if err != nil {
			return nil, fmt.Errorf("inboxmq: route %q: %w", rt.queue, err)
		}
		bind, err := rt.register(router, &consumer.HandlerOpts{
			Namespace:  rt.namespace(),
			Codec:      rt.opts.Codec,
			Middleware: mw,
			Rules:      rt.opts.Rules,
			Policy:     rt.opts.Policy,
			InProcess:  rt.opts.InProcess,
			Queue:      rt.queueOpts(w.s.Inbox),
			Reply:      w.replyOpts(rt),
			Ordered:    rt.opts.Ordered,

			OnDeadLetter: onDead,
		}, rt.groupCommit(w.s.Inbox))
		if err != nil {
			return nil, fmt.Errorf("inboxmq: route %q: %w", rt.queue, err)
		}
		w.binds = append(w.binds, bind)
		if w.metrics != nil {
			w.metrics.Init(rt.queue, rt.namespace())
			if b := rt.opts.Breaker; b != nil {
				w.metrics.InitBreaker(rt.queue, cmp.Or(b.Downstream, "default"))
			}
		}
	}
	return router, nil
}

// replyOpts answers a route's requests with the job's result. A delivery
// the inbox ruled on holds its key's stored bytes (the ones it stored, or
// a duplicate's verdict brings the first delivery's); a duplicate caught
// before the inbox (a hit of the completed-cache) holds none, and its
// result is read from the inbox.
func (w *Worker) replyOpts(rt *route) *consumer.ReplyOpts {
	if !rt.opts.Reply {
		return nil
	}
	return &consumer.ReplyOpts{Result: func(ctx context.Context, d *inboxtype.Delivery, dec retry.Decision) (json.RawMessage, error) {
		s := w.store()
		if dec.Kind != retry.KindDuplicate || d.Result != nil || s == nil || d.Key == "" {
			return d.Result, nil
		}
		rec, err := s.Get(ctx, d.Namespace, d.Key)
		switch {
		case errors.Is(err, inbox.ErrNotFound):
			return nil, nil
		case err != nil:
			return nil, err
		case rec.Status != inbox.RecordCompleted:
			return nil, nil
		}
		return rec.Result, nil
	}}
}

// routeMiddleware returns a route's handler middleware: a blocked key is
// parked before anything else runs, then the completed-cache, the
// breaker, the lock, the rate limit, then the route's own. When a route
// has both the cache and the lock they are one middleware (the lock with
// LockOpts.Cache), in the cache's place before the breaker, so each
// delivery costs one Redis round trip before the chain and one after it.
func (w *Worker) routeMiddleware(rt *route, block inboxtype.Middleware) ([]inboxtype.Middleware, error) {
	var mw []inboxtype.Middleware
	if block != nil {
		mw = append(mw, block)
	}
	rdb := w.s.Redis
	withCache, withLock := rdb != nil && !rt.opts.NoCache, rdb != nil && rt.lockOn()
	var cache *middleware.CacheOpts
	if withCache {
		var o middleware.CacheOpts
		if rt.opts.Cache != nil {
			o = *rt.opts.Cache
		}
		o.Logger, o.OnDegraded = w.logger, w.degradedHook("cache", &w.cacheDown)
		cache = &o
	}
	lockMW := func(cache *middleware.CacheOpts) (inboxtype.Middleware, error) {
		var o middleware.LockOpts
		if rt.opts.Lock != nil {
			o = *rt.opts.Lock
		}
		o.Logger, o.OnDegraded = w.logger, w.degradedHook("lock", &w.lockDown)
		if cache != nil {
			lockHook, cacheHook := o.OnDegraded, cache.OnDegraded
			o.OnDegraded = func(degraded bool) {
				lockHook(degraded)
				cacheHook(degraded)
			}
			o.Cache = cache
		}
		return middleware.Lock(rdb, &o)
	}
	switch {
	case withCache && withLock:
		lck, err := lockMW(cache)
		if err != nil {
			return nil, err
		}
		mw = append(mw, lck)
	case withCache:
		mw = append(mw, middleware.Cache(rdb, cache))
	}
	if rt.opts.Breaker != nil {
		// Before a lock of its own: a delivery held back takes no lock.
		b, err := w.breaker(rt)
		if err != nil {
			return nil, err
		}
		mw = append(mw, b.Guard(rt.queue))
	}
	switch {
	case withLock && !withCache:
		lck, err := lockMW(nil)
		if err != nil {
			return nil, err
		}
		mw = append(mw, lck)
	case !withLock && rdb != nil && rt.opts.Lock != nil:
		// Checked though unused, so that turning the lock on never
		// reveals a bad setting.
		if _, err := lockMW(nil); err != nil {
			return nil, err
		}
	}
	if rt.opts.RateLimit != nil {
		// After the lock: a delivery whose key another worker holds takes
		// no slot.
		o := *rt.opts.RateLimit
		o.Logger, o.OnDegraded = w.logger, w.degradedHook("ratelimit", &w.limitDown)
		if w.metrics != nil {
			o.OnWait = w.metrics.RateLimitWaitHook(cmp.Or(o.Downstream, "default"))
		}
		lim, err := middleware.RateLimit(rdb, &o)
		if err != nil {
			return nil, err
		}
		mw = append(mw, lim)
	}
	mw = append(mw, rt.opts.Middleware...)
	if w.s.Outbox != nil {
		// Innermost: the handler's outbox rows wake this process's relay
		// once its transaction has ended, instead of a NOTIFY each.
		mw = append(mw, w.wakeRelay)
	}
	return mw, nil
}

// wakeRelay runs each delivery under the relay's WakeLocally: the outbox
// rows its handler enqueues send no NOTIFY, and the relay (built by
// NewWorker after the routes) is woken in-process when the handler returns,
// its transaction committed or rolled back.
func (w *Worker) wakeRelay(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
	return func(ctx context.Context, d *inboxtype.Delivery) error {
		ctx, done := w.relay.WakeLocally(ctx)
		defer done()
		return next(ctx, d)
	}
}

// breaker returns the breaker of rt's downstream, built on first use with
// rt's settings: routes naming one downstream share it.
func (w *Worker) breaker(rt *route) (*middleware.Breaker, error) {
	o := *rt.opts.Breaker
	o.Downstream = cmp.Or(o.Downstream, "default")
	if b, ok := w.breakers[o.Downstream]; ok {
		return b, nil
	}
	if o.IsFailure == nil {
		rules := rt.opts.Rules
		o.IsFailure = func(err error) bool {
			dec := retry.Classify(err, rules...)
			return dec.Kind == retry.KindRetry && !dec.Uncounted
		}
	}
	namespaces := make(map[string]string, len(w.routes))
	for _, r := range w.routes {
		namespaces[r.queue] = r.namespace()
	}
	o.Target, o.Logger = consumerTarget{w}, w.logger
	if w.reporter == nil && w.watcher != nil {
		w.reporter = control.NewBreakerReporter(w.s.DB, cmp.Or(w.s.Name, hostPID()), w.logger)
	}
	o.OnStateChange = func(c middleware.BreakerChange) {
		for _, q := range c.Queues {
			if w.metrics != nil {
				w.metrics.BreakerTransition(q, c.Downstream, int(c.To))
			}
			if w.reporter != nil {
				w.reporter.Report(namespaces[q], c.Downstream, c.To.String())
			}
		}
	}
	b, err := middleware.NewBreaker(&o)
	if err != nil {
		return nil, err
	}
	if w.breakers == nil {
		w.breakers = make(map[string]*middleware.Breaker)
	}
	w.breakers[o.Downstream] = b
	return b, nil
}

// degradedHook records a Redis user's state for /readyz and the metrics.
func (w *Worker) degradedHook(component string, flag *atomic.Bool) func(bool) {
	var count func(bool)
	if w.metrics != nil {
		count = w.metrics.RedisDegradedHook(component)
	}
	return func(degraded bool) {
		flag.Store(degraded)
		if count != nil {
			count(degraded)
		}
	}
}

// checks are the /readyz checks the worker provides.
func (w *Worker) checks() []observe.Check {
	checks := []observe.Check{
		{Name: "startup", Func: w.st.check},
		observe.Ready("broker", w.cons.Ready),
		{Name: "database", Func: func(ctx context.Context) error {
			if w.store() == nil {
				return errors.New("not connected yet")
			}
			return w.s.DB.Ping(ctx)
		}},
	}
	if w.s.Redis != nil {
		checks = append(checks, observe.DegradedFlag("redis", func() bool { return w.cacheDown.Load() || w.lockDown.Load() || w.limitDown.Load() }))
	}
	return checks
}

// liveness are the /healthz checks the worker provides: the consumer's
// watchdog (none when threshold is -1).
func (w *Worker) liveness(threshold time.Duration) []observe.Check {
	if threshold < 0 {
		return nil
	}
	return []observe.Check{observe.Watchdog("consumer", func() (int, time.Time) {
		p := w.cons.Progress()
		return p.InFlight, p.LastProgress
	}, threshold)}
}

// Start reaches every service and starts every part: the health listener
// first (so /readyz says what start-up waits for), then the inbox store
// on Config.DB, the controls, the worker's presence row, the exchanges and
// the relay, the reconciler, the retention job, and the consumer last. Each wait for PostgreSQL or
// RabbitMQ is logged and bounded by Config.ConnectTimeout
// ([*StartTimeoutError]). ctx bounds start-up only; the parts run until
// [Worker.Stop].
//
// A partitioned inbox table (migrations.PartitionInbox) without
// Config.Retention is refused: nothing would create its partitions ahead.
//
// If a part fails to start, the parts already started are stopped (within
// Config.StopTimeout) and Start returns the error: nothing keeps running.
// A Worker starts once: Start after Start or Stop returns an error.
func (w *Worker) Start(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != stateNew {
		return errors.New("inboxmq: worker already started")
	}
	if err := w.start(ctx); err != nil {
		return errors.Join(err, w.stopLocked(context.WithoutCancel(ctx)))
	}
	w.state = stateStarted
	w.st.done()
	w.logger.LogAttrs(ctx, slog.LevelInfo, "inboxmq worker started", slog.Int("routes", len(w.routes)))
	return nil
}

func (w *Worker) start(ctx context.Context) error {
	if w.health != nil {
		if err := w.run(ctx, "health", w.health); err != nil {
			return err
		}
	}
	dbURL := w.s.DB.Config().ConnString()
	if err := w.st.wait(ctx, "PostgreSQL", dbURL, "inbox", w.openStore); err != nil {
		return err
	}
	if w.watcher != nil {
		// Before the consumer: a pause set before the start holds.
		w.running["controls"] = w.watcher
		if err := w.st.wait(ctx, "PostgreSQL", dbURL, "controls", w.watcher.Start); err != nil {
			return err
		}
	}
	if w.reporter != nil {
		if err := w.run(ctx, "breakers", w.reporter); err != nil {
			return err
		}
	}
	// After the watcher: a live row with controls on obeys at once. Its
	// failures are logged, never fatal.
	if err := w.run(ctx, "presence", w.presence); err != nil {
		return err
	}
	if o := w.s.Outbox; o != nil {
		if len(o.Exchanges) > 0 {
			if err := w.st.wait(ctx, "RabbitMQ", w.s.URL, "exchanges", w.declareExchanges); err != nil {
				return err
			}
		}
		// The relay outlives ctx: it runs until Stop.
		if err := w.run(context.WithoutCancel(ctx), "relay", w.relay); err != nil {
			return err
		}
	}
	if w.s.Reconciler != nil {
		rc := *w.s.Reconciler
		if rc.OnStale == nil && w.metrics != nil {
			rc.OnStale = w.metrics.StaleRecords
		}
		if rc.Logger == nil {
			rc.Logger = w.logger
		}
		rec, err := inbox.NewReconciler(w.store(), &rc)
		if err != nil {
			return err
		}
		if err := w.run(ctx, "reconciler", rec); err != nil {
			return err
		}
	}
	if w.s.Retention != nil {
		ret, err := inbox.NewRetention(w.store(), w.s.Retention)
		if err != nil {
			return err
		}
		if err := w.run(ctx, "retention", ret); err != nil {
			return err
		}
	}
	// Recorded first: Stop also ends a consumer whose Start failed half way.
	w.running["consumer"] = w.cons
	return w.st.wait(ctx, "RabbitMQ", w.s.URL, "consumer", w.cons.Start)
}

// run records svc for Stop (which is safe on a part whose Start failed)
// and starts it.
func (w *Worker) run(ctx context.Context, name string, svc service) error {
	w.running[name] = svc
	if err := svc.Start(ctx); err != nil {
		return fmt.Errorf("inboxmq: start %s: %w", name, err)
	}
	return nil
}

// openStore checks the inbox table on the pool and binds the routes'
// handlers to the store. It refuses a partitioned inbox table without
// Config.Retention.
func (w *Worker) openStore(ctx context.Context) error {
	if err := w.s.DB.Ping(ctx); err != nil {
		return err
	}
	var sc inbox.StoreConfig
	if w.s.Inbox != nil {
		sc = *w.s.Inbox
	}
	if sc.Logger == nil {
		sc.Logger = w.logger
	}
	s, err := inbox.NewStore(ctx, w.s.DB, &sc)
	if err != nil {
		return err
	}
	if s.Partitioned() && w.s.Retention == nil {
		// Only the store knows (NewWorker does no I/O).
		return fmt.Errorf("inboxmq: the inbox table %s is partitioned and Config.Retention is nil: "+
			"retention creates the partitions ahead (inserts fail once they run out) and drops the old ones; "+
			"set Config.Retention (a zero inbox.RetentionConfig runs it with its defaults)", s.Table())
	}
	for _, bind := range w.binds {
		bind(s)
	}
	w.dead.set(s.DeadLetterObserver())
	w.storeRef.Store(s)
	return nil
}

func (w *Worker) store() *inbox.Store { return w.storeRef.Load() }

// declareExchanges declares Outbox.Exchanges; ctx's deadline bounds the
// dial and the handshake.
func (w *Worker) declareExchanges(ctx context.Context) error {
	d, err := amqpdial.New(amqpdial.Config{URL: w.s.URL, Timeout: w.s.ConnectTimeout})
	if err != nil {
		return err
	}
	conn, _, err := d.Dial(ctx, cmp.Or(w.s.Name, "inboxmq")+" exchanges", amqpdial.RoleAdmin)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("channel: %w", err)
	}
	defer ch.Close()
	for _, e := range w.s.Outbox.Exchanges {
		if err := ch.ExchangeDeclare(e.Name, cmp.Or(e.Kind, amqp.ExchangeTopic), true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %s: %w", e.Name, err)
		}
	}
	return nil
}

// Stop stops the worker gracefully: the consumer first (no new
// deliveries; in-flight ones finish, or are requeued un-acked once the
// consumer's soft stop ends), then it marks its presence row stopped,
// then the relay (which may still publish what the last commits enqueued;
// a row it has not published by then stays in the outbox table and goes
// out with the next relay that runs), then the controls, the reconciler, the retention job and the health
// listener, and last it flushes and shuts down the tracer provider it
// built from the environment (TracingConfig). The whole stop is bounded by
// Config.StopTimeout, or by ctx if it ends first; whatever has not
// committed by then is redelivered by the broker.
//
// Stop waits for a Start in progress to return. It is idempotent (a
// second Stop returns the first one's result) and safe without Start.
func (w *Worker) Stop(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch w.state {
	case stateStopped:
		return w.stopErr
	case stateNew:
		w.state = stateStopped
		close(w.stopped)
		w.stopErr = w.shutdownTracing(ctx)
		return w.stopErr
	}
	w.logger.LogAttrs(ctx, slog.LevelInfo, "inboxmq worker stopping")
	err := w.stopLocked(ctx)
	if err != nil {
		w.logger.LogAttrs(ctx, slog.LevelInfo, "inboxmq worker stopped", slog.Any("error", err))
	} else {
		w.logger.LogAttrs(ctx, slog.LevelInfo, "inboxmq worker stopped")
	}
	return err
}

// stopLocked stops the running parts in stopOrder within one deadline.
func (w *Worker) stopLocked(ctx context.Context) error {
	w.stopping.Store(true)
	w.st.set("stopping")
	sctx, cancel := context.WithTimeout(ctx, w.s.StopTimeout)
	defer cancel()
	var errs []error
	for _, name := range stopOrder {
		if svc, ok := w.running[name]; ok {
			if err := svc.Stop(sctx); err != nil {
				errs = append(errs, fmt.Errorf("inboxmq: stop %s: %w", name, err))
			}
			delete(w.running, name)
		}
	}
	if w.parker != nil {
		_ = w.parker.Close()
	}
	for _, b := range w.breakers {
		b.Close()
	}
	// Last: the parts' final spans are ended by now.
	if err := w.shutdownTracing(sctx); err != nil {
		errs = append(errs, err)
	}
	w.stopErr = errors.Join(errs...)
	w.state = stateStopped
	close(w.stopped)
	return w.stopErr
}

// shutdownTracing flushes and shuts down a tracer provider the worker
// built from the environment.
func (w *Worker) shutdownTracing(ctx context.Context) error {
	if w.ownTP == nil {
		return nil
	}
	if err := w.ownTP.Shutdown(ctx); err != nil {
		return fmt.Errorf("inboxmq: stop tracing: %w", err)
	}
	return nil
}

// Stopped returns a channel closed once the worker has stopped: after
// Stop, or after a Start that failed.
func (w *Worker) Stopped() <-chan struct{} { return w.stopped }

// Wait blocks until ctx is done or the consumer stops on its own (a fatal
// error), then stops the worker (see [Worker.Stop]) within
// Config.StopTimeout. It returns Stop's error, joined with an error
// saying so when the consumer had stopped on its own.
func (w *Worker) Wait(ctx context.Context) error {
	var unexpected error
	select {
	case <-ctx.Done():
	case <-w.cons.Stopped():
		if !w.stopping.Load() {
			unexpected = errors.New("inboxmq: the consumer stopped on its own")
		}
	}
	return errors.Join(unexpected, w.Stop(context.WithoutCancel(ctx)))
}

// Run starts the worker, runs it until ctx is done and stops it
// gracefully: [Worker.Start], then [Worker.Wait]. It returns Start's
// error, or Wait's.
func (w *Worker) Run(ctx context.Context) error {
	if err := w.Start(ctx); err != nil {
		return err
	}
	return w.Wait(ctx)
}

// hostPID is the worker's name when Config.Name is empty, as the
// consumer's: "<hostname>-<pid>".
func hostPID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "inboxmq"
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

// consumerTarget lets the controls watcher, which the Block middleware
// needs when the router is built, drive the consumer, which needs the
// router: the consumer exists before the watcher starts.
type consumerTarget struct{ w *Worker }

func (t consumerTarget) Pause(queue string) error  { return t.w.cons.Pause(queue) }
func (t consumerTarget) Resume(queue string) error { return t.w.cons.Resume(queue) }
func (t consumerTarget) SetConcurrency(queue string, n int) error {
	return t.w.cons.SetConcurrency(queue, n)
}

func (t consumerTarget) Restrict(queue, reason string, n int) error {
	return t.w.cons.Restrict(queue, reason, n)
}

func (t consumerTarget) Unrestrict(queue, reason string) error {
	return t.w.cons.Unrestrict(queue, reason)
}

// lateObserver forwards to an observer set once the store exists (the
// inbox's dead-letter observer); before that it does nothing.
type lateObserver struct {
	o atomic.Pointer[inboxtype.Observer]
}

func (l *lateObserver) set(o inboxtype.Observer) { l.o.Store(&o) }

func (l *lateObserver) get() inboxtype.Observer {
	if p := l.o.Load(); p != nil {
		return *p
	}
	return inboxtype.NopObserver{}
}

func (l *lateObserver) OnTransition(d *inboxtype.Delivery, status inboxtype.Status, err error) {
	l.get().OnTransition(d, status, err)
}

func (l *lateObserver) OnOutcome(d *inboxtype.Delivery, o inboxtype.Outcome) { l.get().OnOutcome(d, o) }

func (l *lateObserver) OnInProcessRetry(d *inboxtype.Delivery, dec retry.Decision, delay time.Duration) {
	l.get().OnInProcessRetry(d, dec, delay)
}

func (l *lateObserver) OnConnState(state inboxtype.ConnState, err error) {
	l.get().OnConnState(state, err)
}

// service is a background part of the worker: Start returns once it runs,
// Stop ends it within ctx (every part runs on internal/startstop).
type service interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}
