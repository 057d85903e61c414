package inboxmq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqpdial"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/controlrun"
	"github.com/inboxmq/inboxmq/internal/held"
	"github.com/inboxmq/inboxmq/internal/logs"
	"github.com/inboxmq/inboxmq/internal/metrics"
	"github.com/inboxmq/inboxmq/internal/middleware"
	"github.com/inboxmq/inboxmq/internal/observe"
	"github.com/inboxmq/inboxmq/internal/relay"
	"github.com/inboxmq/inboxmq/retry"
)

// Worker runs the routes of a [Config] and owns everything they need: the
// consumer, the inbox store, the metrics and the health listener, the
// runtime controls and the worker's presence, the outbox relay, the
// reconciler and retention. Build it with [NewWorker], then call
// [Worker.Run], or [Worker.Start] and [Worker.Stop]. A Worker starts once;
// its methods are safe for concurrent use.
type Worker struct {
	s        *settings
	logger   *slog.Logger
	st       *startup
	store    *inbox.Store
	router   *consumer.Router
	cons     *consumer.Consumer
	metrics  *metrics.Metrics
	held     *held.Store // the strict ordered routes' held keys; nil without one
	watcher  *controlrun.Watcher
	parker   *controlrun.DialParker
	breakers map[string]*middleware.Breaker
	// reporter publishes the breakers' states for inboxctl (with
	// controls); nsOf maps a queue to its namespace for it.
	reporter *controlrun.BreakerReporter
	nsOf     map[string]string
	// stuck counts each route's stuck handlers (stuck.go).
	stuck stuckHandlers
	// services are started in order by Start and stopped in reverse by
	// Stop: the health listener first, the consumer last.
	services []service

	cacheDown, lockDown, limitDown atomic.Bool

	mu       sync.Mutex // held by Start and Stop for their whole run
	state    int
	started  int // services[:started] were started
	stopping atomic.Bool
	stopErr  error
	stopped  chan struct{}
}

const (
	stateNew = iota
	stateStarted
	stateStopped
)

// service is one part of the worker in its start order. start is bounded
// by Config.ConnectTimeout when it waits for a server (wait names it);
// stop, when set, undoes start within the stop deadline.
type service struct {
	name  string
	wait  string // "PostgreSQL", "RabbitMQ", or "" for a part that waits for nothing
	start func(ctx context.Context) error
	stop  func(ctx context.Context) error
}

// NewWorker validates cfg and builds every part of the worker, ready to
// start. It does no I/O: a bad Config, a bad RouteOpts or a route whose
// payload has no idempotency key is reported here, each error naming what
// is wrong; what needs the servers (the inbox table, the broker) is
// checked by [Worker.Start].
func NewWorker(cfg *Config) (*Worker, error) {
	s, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	routes := s.Routes.snapshot()
	var errs []error
	for _, rt := range routes {
		errs = append(errs, rt.err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	w := &Worker{
		s:       s,
		logger:  s.Logger,
		st:      newStartup(s.Logger, s.ConnectTimeout),
		router:  consumer.NewRouter(),
		stopped: make(chan struct{}),
	}
	if w.store, err = inbox.NewStore(s.DB, &inbox.StoreConfig{Table: s.Table, Logger: s.Logger}); err != nil {
		return nil, fmt.Errorf("inboxmq: %w", err)
	}
	if w.metrics, err = metrics.New(s.Registerer, &metrics.Config{Inbox: &metrics.InboxConfig{DB: s.DB, Table: s.Table}}); err != nil {
		return nil, fmt.Errorf("inboxmq: metrics: %w", err)
	}
	if err := w.build(routes); err != nil {
		w.metrics.Unregister(s.Registerer)
		return nil, err
	}
	return w, nil
}

// build builds the router, the consumer and the services, in the order
// Start starts them.
func (w *Worker) build(routes []*route) error {
	s := w.s
	namespaces := make(map[string]string, len(routes))
	w.nsOf = make(map[string]string, len(routes))
	for _, rt := range routes {
		namespaces[rt.namespace()] = rt.queue
		w.nsOf[rt.queue] = rt.namespace()
		if rt.opts.Breaker != nil && !s.DisableControls && w.reporter == nil {
			w.reporter = controlrun.NewBreakerReporter(s.DB, s.Name, w.logger)
		}
	}
	if !s.DisableControls && len(routes) > 0 {
		var err error
		w.watcher, err = controlrun.NewWatcher(s.DB, &controlrun.WatcherConfig{Target: w.router, Queues: namespaces, Logger: w.logger})
		if err != nil {
			return fmt.Errorf("inboxmq: controls: %w", err)
		}
		w.parker = controlrun.NewDialParker(s.URL, &controlrun.DialParkerOpts{
			ConnectionName: s.Name + " parker", DialTimeout: s.ConnectTimeout, Logger: w.logger,
			OnBrokerNode: w.brokerNodeHook(s.URL, amqpdial.RoleParker),
		})
	}
	var outboxRelay *relay.Relay
	if !s.DisableRelay {
		var err error
		outboxRelay, err = relay.New(s.DB, &relay.Config{
			URL: s.URL, ConnectionName: s.Name + " outbox", AllowUnroutable: s.DropUnroutable,
			Logger: w.logger, Registerer: s.Registerer, TracerProvider: s.TracerProvider,
			OnBrokerNode: w.brokerNodeHook(s.URL, amqpdial.RoleRelay),
		})
		if err != nil {
			return fmt.Errorf("inboxmq: outbox relay: %w", err)
		}
	}

	// Router-wide middleware, outermost first: a span per delivery (its
	// parent from the headers) and the bound on a handler's run. Panics
	// become errors in the consumer's last guard, around the whole chain.
	w.router.Use(middleware.Tracing(s.TracerProvider, nil), middleware.Timeout(s.HandlerTimeout))
	// Then the held keys of strict ordered routes, before decoding: a
	// message of a held key waits in its line whatever it holds.
	strict := map[string]bool{}
	for _, rt := range routes {
		if o := rt.opts.Ordered; o != nil && o.Strict {
			strict[rt.namespace()] = true
		}
	}
	if len(strict) > 0 {
		w.held = held.NewStore(s.DB)
		w.router.Use(w.held.Guard(strict, w.logger))
	}
	var block inboxtype.Middleware
	if w.watcher != nil {
		var err error
		if block, err = middleware.Block(w.watcher, w.parker, &middleware.BlockOpts{Logger: w.logger}); err != nil {
			return fmt.Errorf("inboxmq: controls: %w", err)
		}
	}
	var wake inboxtype.Middleware
	if outboxRelay != nil {
		// Innermost: the outbox rows a handler enqueues wake this
		// process's relay once its transaction has ended, instead of a
		// NOTIFY each.
		wake = func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
			return func(ctx context.Context, d *inboxtype.Delivery) error {
				ctx, done := outboxRelay.WakeLocally(ctx)
				defer done()
				return next(ctx, d)
			}
		}
	}
	for _, rt := range routes {
		if err := w.addRoute(rt, block, wake); err != nil {
			return fmt.Errorf("inboxmq: route %q: %w", rt.queue, err)
		}
	}
	if len(routes) > 0 {
		var err error
		cc := &consumer.Config{
			URL: s.URL, Name: s.Name, Router: w.router, Logger: w.logger, DialTimeout: s.ConnectTimeout,
			HandlerTimeout: max(s.HandlerTimeout, 0),
			Observers:      []inboxtype.Observer{w.metrics, logs.NewObserver(w.logger, nil), w.store.DeadLetterObserver()},
			OnBrokerNode:   w.brokerNodeHook(s.URL, amqpdial.RoleConsumer, amqpdial.RolePublisher),
		}
		if outboxRelay != nil {
			// Retries wait in the outbox, not in the broker's delay
			// queues: a retry comes back on time even when the node
			// leading its queue is lost (docs/design.md, "Retries").
			cc.ScheduleRetry = outboxRelay.Schedule
		}
		w.cons, err = consumer.New(cc)
		if err != nil {
			return fmt.Errorf("inboxmq: %w", err)
		}
	}

	// The services, in start order; Stop goes the other way: the consumer
	// first (in-flight deliveries finish, the rest are requeued), then the
	// presence row, the relay (it may still publish what the last commits
	// enqueued), the controls, the maintenance jobs and the listener.
	if s.Addr != "" {
		health := observe.NewServer(&observe.ServerConfig{
			Addr: s.Addr, Gatherer: s.gatherer, Checks: w.checks(), Liveness: w.liveness(),
		})
		w.services = append(w.services, service{name: "health", start: health.Start, stop: health.Stop})
	}
	w.services = append(w.services, service{name: "inbox", wait: "PostgreSQL", start: w.checkStore, stop: w.store.Stop})
	if len(s.Exchanges) > 0 {
		w.services = append(w.services, service{name: "exchanges", wait: "RabbitMQ", start: w.declareExchanges})
	}
	if len(routes) > 0 {
		if err := w.maintenance(routes); err != nil {
			return err
		}
	}
	if w.reporter != nil {
		w.services = append(w.services, service{name: "breakers", start: w.reporter.Start, stop: w.reporter.Stop})
	}
	if w.watcher != nil {
		// Before the consumer: a pause set before the start holds.
		w.services = append(w.services, service{name: "controls", wait: "PostgreSQL", start: w.watcher.Start, stop: w.stopControls})
	}
	if outboxRelay != nil {
		w.services = append(w.services, service{name: "relay", start: outboxRelay.Start, stop: outboxRelay.Stop})
	}
	ns := make([]string, 0, len(namespaces))
	for n := range namespaces {
		ns = append(ns, n)
	}
	host, _ := os.Hostname()
	presence := controlrun.NewHeartbeat(s.DB, control.Presence{
		ID: s.Name, Host: host, PID: os.Getpid(), Namespaces: ns, Version: Version, Controls: w.watcher != nil,
	}, w.logger)
	presence.OnStale = w.metrics.SetWorkersStale
	w.services = append(w.services, service{name: "presence", start: presence.Start, stop: presence.Stop})
	if w.cons != nil {
		w.services = append(w.services, service{name: "consumer", wait: "RabbitMQ", start: w.cons.Start, stop: w.cons.Stop})
		// Last: the consumer has declared the routes' queues.
		lint := w.lintRoutes(routes)
		w.services = append(w.services, service{name: "topology lint", start: func(ctx context.Context) error {
			w.lintTopology(ctx, lint)
			return nil
		}})
	}
	return nil
}

// addRoute registers rt in the router with the worker's middleware:
// blocked keys are parked first, then the completed-cache, the breaker
// (a delivery it holds back takes no lock), the lock (with the cache, two
// Redis round trips before the handler, cache read and obtain; two after,
// release and cache write), the rate limit, the route's own middleware and
// the relay's wake-up; and its fault events and replies.
func (w *Worker) addRoute(rt *route, block, wake inboxtype.Middleware) error {
	// Outermost of the route's: a handler that outlives its context is
	// reported, with its key, however far in it got.
	if w.stuck == nil {
		w.stuck = stuckHandlers{}
	}
	w.stuck[rt.queue] = new(atomic.Int64)
	mw := []inboxtype.Middleware{middleware.Stuck(w.s.stuckAfter(), w.reportStuck)}
	if block != nil {
		mw = append(mw, block)
	}
	if rt.opts.Fair != nil && rt.opts.Ordered != nil {
		return errors.New("RouteOpts.Fair and RouteOpts.Ordered exclude each other")
	}
	switch rt.opts.AfterDead {
	case "", ReuseRun:
	case ReuseReject, ReuseAttach:
		mw = append(mw, reuseGuard(w.store, rt.opts.AfterDead))
	default:
		return fmt.Errorf("RouteOpts.AfterDead %q: want %q, %q or %q", rt.opts.AfterDead, ReuseRun, ReuseReject, ReuseAttach)
	}
	rdb := w.s.Redis
	if rdb != nil {
		// In front of the lock: a delivery the cache answers takes none.
		mw = append(mw, middleware.Cache(rdb, &middleware.CacheOpts{Logger: w.logger, OnDegraded: w.degradedHook("cache", &w.cacheDown)}))
	}
	// Before the breaker and the lock: a deferred key or tenant takes no
	// probe and no lock. A fair route's tenant is its routing key unless
	// the route names it.
	tenant := rt.opts.Tenant
	if rt.opts.Fair != nil && tenant == nil {
		tenant = func(d *inboxtype.Delivery) string {
			if d.Raw == nil {
				return ""
			}
			return d.Raw.RoutingKey
		}
	}
	mw = append(mw, middleware.Deferral(tenant))
	if rt.opts.Breaker != nil {
		b, err := w.breaker(rt)
		if err != nil {
			return err
		}
		mw = append(mw, b.Guard(rt.queue))
	}
	if l := rt.opts.Lock; l != nil {
		if rdb == nil {
			return errors.New("RouteOpts.Lock needs Config.Redis")
		}
		lck, err := middleware.Lock(rdb, &middleware.LockOpts{
			TTL: l.TTL, RetryDelay: l.RetryDelay, Logger: w.logger, OnDegraded: w.degradedHook("lock", &w.lockDown),
		})
		if err != nil {
			return err
		}
		mw = append(mw, lck)
	}
	if r := rt.opts.RateLimit; r != nil {
		// After the lock: a delivery whose key another worker holds takes
		// no slot.
		downstream := cmp.Or(r.Downstream, "default")
		lim, err := middleware.RateLimit(rdb, &middleware.RateLimitOpts{
			Downstream: downstream, Rate: r.Rate, Burst: r.Burst, ExpectedWorkers: r.ExpectedWorkers, MaxWait: r.MaxWait,
			Logger: w.logger, OnDegraded: w.degradedHook("ratelimit", &w.limitDown), OnWait: w.metrics.RateLimitWaitHook(downstream),
		})
		if err != nil {
			return err
		}
		mw = append(mw, lim)
	}
	mw = append(mw, rt.opts.Middleware...)
	if wake != nil {
		mw = append(mw, wake)
	}
	onDead, err := w.faultHook(rt)
	if err != nil {
		return err
	}
	if o := rt.opts.Ordered; o != nil && o.Strict {
		// First the hold, then the fault event: a hook that fails
		// requeues the delivery, and the hold is idempotent.
		hold := w.held.OnDeadLetter(rt.namespace(), rt.queue, cmp.Or(o.Exchange, rt.queue), w.logger)
		onDead = chainDeadLetter(hold, onDead)
		w.metrics.InitHeld(rt.namespace())
	}
	var reply *consumer.ReplyOpts
	if rt.opts.Reply {
		reply = &consumer.ReplyOpts{Result: w.store.ReplyResult}
	}
	if err := rt.build(w.router, w.store, &consumer.HandlerOpts{
		Namespace: rt.namespace(), Middleware: mw, Rules: rt.opts.Rules, Policy: rt.policy(), InProcess: rt.opts.InProcess,
		Queue: rt.queueOpts(), Ordered: rt.orderedOpts(), Reply: reply, OnDeadLetter: onDead,
	}); err != nil {
		return err
	}
	w.metrics.Init(rt.queue, rt.namespace())
	if b := rt.opts.Breaker; b != nil {
		w.metrics.InitBreaker(rt.queue, cmp.Or(b.Downstream, "default"))
	}
	return nil
}

// chainDeadLetter runs the dead-letter hooks in order, stopping at the
// first error; nil hooks are left out.
func chainDeadLetter(hooks ...func(context.Context, consumer.DeadLetter) error) func(context.Context, consumer.DeadLetter) error {
	hooks = slices.DeleteFunc(hooks, func(h func(context.Context, consumer.DeadLetter) error) bool { return h == nil })
	return func(ctx context.Context, dl consumer.DeadLetter) error {
		for _, h := range hooks {
			if err := h(ctx, dl); err != nil {
				return err
			}
		}
		return nil
	}
}

// maintenance adds the reconciler and the retention job to the services.
func (w *Worker) maintenance(routes []*route) error {
	if w.s.ReconcileInterval > 0 {
		checks := make(map[string]inbox.EffectCheck)
		for _, rt := range routes {
			if c := rt.opts.Claim; c != nil && c.EffectCheck != nil {
				checks[rt.namespace()] = c.EffectCheck
			}
		}
		rec, err := inbox.NewReconciler(w.store, &inbox.ReconcilerConfig{
			Interval: w.s.ReconcileInterval, EffectChecks: checks, OnStale: w.metrics.StaleRecords,
		})
		if err != nil {
			return fmt.Errorf("inboxmq: reconciler: %w", err)
		}
		w.services = append(w.services, service{name: "reconciler", start: rec.Start, stop: rec.Stop})
	}
	window, why, err := w.s.retentionWindow(routes)
	if err != nil {
		return err
	}
	if window > 0 {
		ret, err := inbox.NewRetention(w.store, &inbox.RetentionConfig{Window: window})
		if err != nil {
			return fmt.Errorf("inboxmq: retention: %w", err)
		}
		start := func(ctx context.Context) error {
			attrs := []slog.Attr{slog.Duration("window", window)}
			if why != "" {
				attrs = append(attrs, slog.String("longest_redelivery_horizon", why))
			}
			w.logger.LogAttrs(ctx, slog.LevelInfo, "inboxmq: retention keeps completed inbox rows for the window", attrs...)
			return ret.Start(ctx)
		}
		w.services = append(w.services, service{name: "retention", start: start, stop: ret.Stop})
	}
	return nil
}

// checkStore checks the inbox table (primary, table, layout); a
// partitioned inbox needs the retention job, which creates its partitions.
func (w *Worker) checkStore(ctx context.Context) error {
	if err := w.store.Check(ctx); err != nil {
		return err
	}
	if w.held != nil {
		if err := w.held.Check(ctx); err != nil {
			return fmt.Errorf("inboxmq: %w", err)
		}
	}
	if w.store.Partitioned() && w.s.RetentionWindow == -1 {
		return fmt.Errorf("inboxmq: the inbox table %s is partitioned and Config.RetentionWindow is -1: "+
			"retention creates the partitions ahead and drops the old ones; leave it on", w.store.Table())
	}
	// The owner session: claims name it, so that this process's death
	// frees them at once.
	return w.store.Start(ctx)
}

// stopControls stops the watcher and closes the parker's connection.
func (w *Worker) stopControls(ctx context.Context) error {
	err := w.watcher.Stop(ctx)
	if w.parker != nil {
		_ = w.parker.Close()
	}
	return err
}

// brokerNodeHook returns the OnBrokerNode hook of a part connecting to
// rawURL's nodes, its series pre-initialised for each role.
func (w *Worker) brokerNodeHook(rawURL string, roles ...string) func(role, node string, connected bool) {
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

// breaker returns the breaker of rt's downstream, built on first use with
// rt's settings: routes naming one downstream share it.
func (w *Worker) breaker(rt *route) (*middleware.Breaker, error) {
	o := rt.opts.Breaker
	downstream := cmp.Or(o.Downstream, "default")
	if b, ok := w.breakers[downstream]; ok {
		return b, nil
	}
	rules := rt.opts.Rules
	b, err := middleware.NewBreaker(&middleware.BreakerOpts{
		Downstream: downstream, Window: o.Window, Threshold: o.Threshold, MinCalls: o.MinCalls, CoolDown: o.CoolDown,
		Target: w.router, Logger: w.logger,
		IsFailure: func(err error) bool {
			dec := retry.Classify(err, rules...)
			return dec.Kind == retry.KindRetry && !dec.Uncounted
		},
		OnStateChange: func(c middleware.BreakerChange) {
			for _, q := range c.Queues {
				w.metrics.BreakerTransition(q, c.Downstream, int(c.To))
				if w.reporter != nil {
					w.reporter.Report(w.nsOf[q], c.Downstream, c.To.String())
				}
			}
		},
	})
	if err != nil {
		return nil, err
	}
	if w.breakers == nil {
		w.breakers = make(map[string]*middleware.Breaker)
	}
	w.breakers[downstream] = b
	return b, nil
}

// degradedHook records a Redis user's state for /readyz and the metrics.
func (w *Worker) degradedHook(component string, flag *atomic.Bool) func(bool) {
	count := w.metrics.RedisDegradedHook(component)
	return func(degraded bool) {
		flag.Store(degraded)
		count(degraded)
	}
}

// checks are the /readyz checks.
func (w *Worker) checks() []observe.Check {
	checks := []observe.Check{
		{Name: "startup", Func: w.st.check},
		{Name: "database", Func: func(ctx context.Context) error { return w.s.DB.Ping(ctx) }},
	}
	if w.cons != nil {
		checks = append(checks, observe.Ready("broker", w.cons.Ready))
	}
	if w.s.Redis != nil {
		checks = append(checks, observe.DegradedFlag("redis", func() bool { return w.cacheDown.Load() || w.lockDown.Load() || w.limitDown.Load() }))
	}
	return checks
}

// liveness are the /healthz checks: every slot of a route held by a
// stuck handler, and the consumer's watchdog.
func (w *Worker) liveness() []observe.Check {
	if w.cons == nil {
		return nil
	}
	checks := []observe.Check{w.stuckCheck()}
	if w.s.StallThreshold < 0 {
		return checks
	}
	return append(checks, observe.Watchdog("consumer", func() (int, time.Time) {
		p := w.cons.Progress()
		return p.InFlight, p.LastProgress
	}, w.s.StallThreshold))
}

// declareExchanges declares Config.Exchanges; ctx's deadline bounds the
// dial and the handshake.
func (w *Worker) declareExchanges(ctx context.Context) error {
	d, err := amqpdial.New(amqpdial.Config{URL: w.s.URL, Timeout: w.s.ConnectTimeout})
	if err != nil {
		return err
	}
	conn, _, err := d.Dial(ctx, w.s.Name+" exchanges", amqpdial.RoleAdmin)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("channel: %w", err)
	}
	defer ch.Close()
	for _, e := range w.s.Exchanges {
		if err := ch.ExchangeDeclare(e, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %s: %w", e, err)
		}
	}
	return nil
}

// Start checks the servers and starts every part, in order: the health
// listener first (so /readyz says what start-up waits for), the inbox
// check (the primary, the table, its layout), the exchanges, the
// maintenance jobs, the controls, the outbox relay, the presence row, and
// the consumer last. Each wait for PostgreSQL or RabbitMQ is logged and
// bounded by Config.ConnectTimeout ([*StartTimeoutError]). ctx bounds
// start-up only; the parts run until [Worker.Stop].
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
	for _, svc := range w.services {
		if err := w.startOne(ctx, svc); err != nil {
			return errors.Join(err, w.stopLocked(context.WithoutCancel(ctx)))
		}
		w.started++
	}
	w.state = stateStarted
	w.st.done()
	w.logger.LogAttrs(ctx, slog.LevelInfo, "inboxmq worker started", slog.Int("routes", len(w.router.Routes())))
	return nil
}

func (w *Worker) startOne(ctx context.Context, svc service) error {
	if svc.wait == "" {
		if err := svc.start(ctx); err != nil {
			return fmt.Errorf("inboxmq: start %s: %w", svc.name, err)
		}
		return nil
	}
	addr := w.s.URL
	if svc.wait == "PostgreSQL" {
		addr = w.s.DB.Config().ConnString()
	}
	return w.st.wait(ctx, svc.wait, addr, svc.name, svc.start)
}

// Stop stops the worker gracefully: its parts in the reverse order of
// Start — the consumer first (no new deliveries; in-flight ones finish, or
// are requeued un-acked once the consumer's soft stop ends), then the
// presence row (marked stopped), the relay (which may still publish what
// the last commits enqueued; a row it has not published stays in the
// outbox table for the next relay), the controls, the maintenance jobs and
// the health listener. The whole stop is bounded by Config.StopTimeout, or
// by ctx if it ends first; whatever has not committed by then is
// redelivered by the broker.
//
// Stop waits for a Start in progress to return. It is idempotent (a second
// Stop returns the first one's result) and safe without Start.
func (w *Worker) Stop(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch w.state {
	case stateStopped:
		return w.stopErr
	case stateNew:
		w.state = stateStopped
		close(w.stopped)
		return nil
	}
	w.logger.LogAttrs(ctx, slog.LevelInfo, "inboxmq worker stopping")
	err := w.stopLocked(ctx)
	w.logger.LogAttrs(ctx, slog.LevelInfo, "inboxmq worker stopped", slog.Any("error", err))
	return err
}

// stopLocked stops the started parts in reverse order within one
// deadline.
func (w *Worker) stopLocked(ctx context.Context) error {
	w.stopping.Store(true)
	w.st.set("stopping")
	sctx, cancel := context.WithTimeout(ctx, w.s.StopTimeout)
	defer cancel()
	var errs []error
	// A part whose start failed half way is stopped too: its stop is safe
	// on a part that did not start.
	last := min(w.started, len(w.services)-1)
	for i := last; i >= 0; i-- {
		svc := w.services[i]
		if svc.stop == nil {
			continue
		}
		if err := svc.stop(sctx); err != nil {
			errs = append(errs, fmt.Errorf("inboxmq: stop %s: %w", svc.name, err))
		}
	}
	for _, b := range w.breakers {
		b.Close()
	}
	w.stopErr = errors.Join(errs...)
	w.state = stateStopped
	close(w.stopped)
	return w.stopErr
}

// Stopped returns a channel closed once the worker has stopped: after
// Stop, or after a Start that failed.
func (w *Worker) Stopped() <-chan struct{} { return w.stopped }

// Wait blocks until ctx is done or the consumer stops on its own (a fatal
// error), then stops the worker (see [Worker.Stop]) within
// Config.StopTimeout. It returns Stop's error, joined with an error saying
// so when the consumer had stopped on its own.
func (w *Worker) Wait(ctx context.Context) error {
	var unexpected error
	var consumerStopped <-chan struct{} // nil without routes: never ready
	if w.cons != nil {
		consumerStopped = w.cons.Stopped()
	}
	select {
	case <-ctx.Done():
	case <-consumerStopped:
		if !w.stopping.Load() {
			unexpected = errors.New("inboxmq: the consumer stopped on its own")
		}
	}
	return errors.Join(unexpected, w.Stop(context.WithoutCancel(ctx)))
}

// Run starts the worker, runs it until ctx is done and stops it
// gracefully: [Worker.Start], then [Worker.Wait]. It returns Start's error,
// or Wait's.
func (w *Worker) Run(ctx context.Context) error {
	if err := w.Start(ctx); err != nil {
		return err
	}
	return w.Wait(ctx)
}

// hostPID is the worker's name when Config.Name is empty:
// "<hostname>-<pid>".
func hostPID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "inboxmq"
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}
