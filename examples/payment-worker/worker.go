package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/metrics"
	"github.com/inboxmq/inboxmq/middleware"
	"github.com/inboxmq/inboxmq/observe"
	"github.com/inboxmq/inboxmq/outbox"
)

// stopTimeout bounds the graceful stop: the contract promises exit within
// 30 s of SIGTERM, and the consumer's soft stop (10 s) fits well inside.
const stopTimeout = 25 * time.Second

// handlerTimeout bounds one delivery's handling (lock, inbox, gateway);
// past it the delivery is retried.
const handlerTimeout = time.Minute

// gatewayReasons are the retry reasons this worker adds; metrics
// pre-initialises them so dashboards see zeros from start-up.
var gatewayReasons = []string{reasonGateway5xx, reasonGateway4xx, reasonGatewayTimeout, reasonGateway429, reasonGatewayNetwork}

// run wires the worker and consumes until ctx ends (SIGINT or SIGTERM), then
// stops: no new deliveries, in-flight ones finish or are requeued un-acked.
func run(ctx context.Context, cfg config) error {
	// JSON on stderr, unsampled: every transition of every delivery is logged.
	zcfg := zap.NewProductionConfig()
	zcfg.Sampling = nil
	logger, err := zcfg.Build()
	if err != nil {
		return fmt.Errorf("logger: %w", err)
	}
	defer func() { _ = logger.Sync() }()

	// /metrics, /healthz and /readyz come up before any service is
	// reached: an orchestrator sees the process alive while it waits, and
	// /readyz names what is missing (check "startup").
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	st := newStartup(logger, cfg.ConnectTimeout)
	var (
		poolRef atomic.Pointer[pgxpool.Pool]
		consRef atomic.Pointer[consumer.Consumer]
		metRef  atomic.Pointer[metrics.Metrics]
	)
	srv := observe.NewServer(&observe.ServerConfig{
		Addr:     cfg.MetricsAddr,
		Gatherer: reg,
		Checks: []observe.Check{
			{Name: "startup", Func: st.check},
			observe.Ready("broker", func() bool { c := consRef.Load(); return c != nil && c.Ready() }),
			{Name: "database", Func: func(ctx context.Context) error {
				if p := poolRef.Load(); p != nil {
					return p.Ping(ctx)
				}
				return errors.New("not connected yet")
			}},
			observe.DegradedFlag("redis", func() bool { m := metRef.Load(); return m != nil && m.RedisDegraded() }),
		},
	})
	if err := srv.Start(ctx); err != nil {
		return err
	}
	// Shut down last, after the services and connections below.
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()

	pool, err := openPool(cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	var store *inbox.Store
	if err := st.wait(ctx, "PostgreSQL", cfg.DatabaseURL, "inbox", func(ctx context.Context) error {
		if err := pool.Ping(ctx); err != nil {
			return err
		}
		store, err = inbox.NewStore(ctx, pool, &inbox.StoreConfig{Logger: logger})
		return err
	}); err != nil {
		return err
	}
	poolRef.Store(pool)

	m, err := metrics.New(reg, &metrics.Config{
		ExtraReasons: gatewayReasons,
		Inbox:        &metrics.InboxConfig{DB: pool},
	})
	if err != nil {
		return err
	}
	m.Init(cfg.Queue, cfg.Queue)
	metRef.Store(m)

	rdb, err := redisClient(cfg.RedisURL)
	if err != nil {
		return err
	}
	defer rdb.Close()

	// Background services are stopped in reverse order of their start,
	// each bounded, after the consumer has stopped and before the pool and
	// the Redis client close.
	var stops []func(context.Context) error
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		for i := len(stops) - 1; i >= 0; i-- {
			_ = stops[i](sctx)
		}
	}()

	// Runtime controls (inboxctl pause/resume/concurrency/block) reach this
	// worker through PostgreSQL. The watcher exists before the router (the
	// Block middleware asks it which keys are blocked) and starts, with the
	// consumer as its target, before the consumer does: a pause set before
	// the start holds.
	target := &consumerTarget{}
	watcher, err := control.NewWatcher(pool, &control.WatcherConfig{
		Target: target, Queues: map[string]string{cfg.Queue: cfg.Queue}, Logger: logger,
	})
	if err != nil {
		return err
	}
	parker := &redialParker{url: cfg.AMQPURL, name: "payment-worker-parker"}
	defer parker.Close()

	router, err := newRouter(store, rdb, m, watcher, parker, logger, cfg)
	if err != nil {
		return err
	}
	c, err := consumer.New(&consumer.Config{
		URL:         cfg.AMQPURL,
		Router:      router,
		Logger:      logger,
		Observers:   []inboxtype.Observer{m, middleware.NewLogObserver(logger, nil), store.DeadLetterObserver()},
		DialTimeout: cfg.ConnectTimeout,
	})
	if err != nil {
		return err
	}
	consRef.Store(c)

	if err := st.wait(ctx, "RabbitMQ", cfg.AMQPURL, "events exchange", func(ctx context.Context) error {
		return declareEvents(ctx, cfg)
	}); err != nil {
		return err
	}
	relay, err := outbox.NewRelay(pool, &outbox.RelayConfig{
		URL:             cfg.AMQPURL,
		ConnectionName:  "payment-worker-outbox",
		AllowUnroutable: true, // an event nobody subscribed to is dropped, not retried forever
		Logger:          logger,
		Registerer:      reg,
	})
	if err != nil {
		return err
	}
	// The relay outlives ctx: it is stopped after the consumer, so the
	// events of the last commits still go out.
	if err := relay.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	stops = append(stops, relay.Stop)

	// Maintenance: stale claims of vanished workers become retryable (and
	// are counted), completed rows past the dedup window are deleted. Both
	// are safe to run in every worker.
	rec, err := inbox.NewReconciler(store, &inbox.ReconcilerConfig{OnStale: m.StaleRecords, Logger: logger})
	if err != nil {
		return err
	}
	recCtx, stopRec := context.WithCancel(context.WithoutCancel(ctx))
	recDone := make(chan struct{})
	go func() {
		defer close(recDone)
		_ = rec.Run(recCtx)
	}()
	stops = append(stops, func(ctx context.Context) error {
		stopRec()
		select {
		case <-recDone:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	ret, err := inbox.NewRetention(store, &inbox.RetentionConfig{Logger: logger})
	if err != nil {
		return err
	}
	if err := ret.Start(ctx); err != nil {
		return err
	}
	stops = append(stops, ret.Stop)

	target.c = c
	wctx, cancelWatcher := context.WithTimeout(ctx, cfg.ConnectTimeout) // its first read only
	err = watcher.Start(wctx)
	cancelWatcher()
	if err != nil {
		return err
	}
	stops = append(stops, watcher.Stop)

	if err := st.wait(ctx, "RabbitMQ", cfg.AMQPURL, "consumer", c.Start); err != nil {
		return err
	}
	st.done()
	logger.Info("payment-worker consuming",
		zap.String("queue", cfg.Queue),
		zap.Bool("gateway", cfg.GatewayURL != ""),
		zap.Bool("group_commit", cfg.GroupCommit),
		zap.String("amqp_url", consumer.RedactURL(cfg.AMQPURL)),
		zap.String("metrics_addr", cfg.MetricsAddr))

	select {
	case <-ctx.Done():
	case <-c.Stopped():
		return errors.New("consumer stopped unexpectedly")
	}
	logger.Info("payment-worker stopping")
	st.set("stopping")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
	defer cancel()
	if err := c.Stop(sctx); err != nil {
		return err
	}
	logger.Info("payment-worker stopped")
	return nil
}

// openPool builds the pool of DATABASE_URL; it connects on first use (the
// caller bounds that wait). Unless the URL sets pool_max_conns, the pool is
// sized for the handlers plus the background services (outbox relay,
// LISTEN connections, reconciler, retention, metrics); unless it sets
// connect_timeout, each new connection is bounded by CONNECT_TIMEOUT.
func openPool(cfg config) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		// The parse error may echo the URL: never wrap it.
		return nil, fmt.Errorf("DATABASE_URL %s: not a valid PostgreSQL URL", consumer.RedactURL(cfg.DatabaseURL))
	}
	if !strings.Contains(cfg.DatabaseURL, "pool_max_conns") {
		pcfg.MaxConns = int32(min(cfg.Concurrency+8, 200)) //nolint:gosec // bounded above
	}
	if pcfg.ConnConfig.ConnectTimeout == 0 {
		pcfg.ConnConfig.ConnectTimeout = cfg.ConnectTimeout
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", consumer.RedactURL(cfg.DatabaseURL), err)
	}
	return pool, nil
}

// redisClient builds the Redis client. It does not ping: Redis is an
// accelerator, and the lock and cache middleware degrade to PostgreSQL alone
// while it is unreachable.
func redisClient(rawURL string) (redis.UniversalClient, error) {
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL %s: not a redis:// or rediss:// URL", consumer.RedactURL(rawURL))
	}
	opt.DialTimeout = 500 * time.Millisecond
	opt.ReadTimeout = 500 * time.Millisecond
	opt.WriteTimeout = 500 * time.Millisecond
	opt.MaxRetries = 0
	opt.ContextTimeoutEnabled = true // the middleware's call timeouts bound socket reads
	return redis.NewClient(opt), nil
}

// newRouter registers the payment handler: transactional mode without a
// gateway, claim mode with one. The completed-cache and the Redis lock run
// after decoding, so they see the idempotency key.
func newRouter(store *inbox.Store, rdb redis.UniversalClient, m *metrics.Metrics, watcher *control.Watcher, parker middleware.Parker, logger *zap.Logger, cfg config) (*consumer.Router, error) {
	router := consumer.NewRouter()
	// Router-wide, outermost first: panics become errors, a span per
	// delivery (trace context from the headers), handler timing with the
	// trace as exemplar, and a bound on a stuck handler.
	router.Use(
		middleware.Recover(&middleware.RecoverOpts{Logger: logger}),
		middleware.Tracing(nil, nil),
		middleware.Metrics(m),
		middleware.Timeout(handlerTimeout),
	)

	cache := middleware.Cache(rdb, &middleware.CacheOpts{Logger: logger, OnDegraded: m.RedisDegradedHook("cache")})
	// A copy that finds the key locked waits in a delay tier: 1s at first (a
	// payment commits in milliseconds, so the holder is done by then and the
	// copy is acked as a duplicate), longer if it finds the key locked again,
	// never past the holder's remaining TTL.
	lck, err := middleware.Lock(rdb, &middleware.LockOpts{TTL: cfg.LockTTL, RetryDelay: time.Second, Logger: logger, OnDegraded: m.RedisDegradedHook("lock")})
	if err != nil {
		return nil, err
	}
	// A key blocked at ingress (inboxctl block) is parked before anything
	// else runs; inboxctl unblock releases it to be processed once.
	block, err := middleware.Block(watcher, parker, &middleware.BlockOpts{Logger: logger})
	if err != nil {
		return nil, err
	}
	opts := &consumer.HandlerOpts{
		Middleware: []inboxtype.Middleware{block, cache, lck},
		Queue:      consumer.QueueOpts{Concurrency: cfg.Concurrency},
	}

	// With GROUP_COMMIT=on, deliveries handled concurrently share one
	// transaction (the store's defaults: up to 64, 2ms, 2 in flight).
	var group *inbox.GroupCommit
	if cfg.GroupCommit {
		group = &inbox.GroupCommit{}
	}
	var h inboxtype.Handler[Payment]
	if cfg.GatewayURL == "" {
		h = inbox.Handler(store, recordPayment(cfg.EventsExchange), &inbox.HandlerOpts{GroupCommit: group})
	} else {
		gw := &Gateway{BaseURL: cfg.GatewayURL}
		h = inbox.ClaimHandler(store, chargeAndRecord(gw, cfg.EventsExchange), &inbox.ClaimOpts{GroupCommit: group})
	}
	if err := consumer.RegisterSafely(router, cfg.Queue, h, opts); err != nil {
		return nil, err
	}
	return router, nil
}

// recordPayment is the transactional handler: the payment, its ledger
// entry and its payment.completed event are written in the transaction that
// records the inbox row, so they commit together or not at all.
func recordPayment(events string) inbox.TxHandlerFunc[Payment] {
	return func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[Payment]) error {
		return writePayment(ctx, tx, events, msg.Body)
	}
}

// chargeAndRecord is the claim-mode handler: the charge happens outside
// PostgreSQL, so the key is claimed first, the gateway is called with the
// claim's key, and the completion commits the business writes only if the
// claim still holds.
func chargeAndRecord(gw *Gateway, events string) inbox.ClaimFunc[Payment] {
	return func(ctx context.Context, claim *inbox.Claim, msg *inboxtype.Message[Payment]) error {
		// A recorded step is skipped on a later attempt: a crash between the
		// charge and the completion does not even repeat the call (and if
		// it did, the gateway would see the same Idempotency-Key).
		if _, err := claim.Step(ctx, "charge", func(ctx context.Context) (any, error) {
			return nil, gw.Charge(ctx, claim.Key, msg.Body)
		}); err != nil {
			return err
		}
		return claim.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error {
			return writePayment(ctx, tx, events, msg.Body)
		})
	}
}

// completedEvent is the body of a payment.completed event.
type completedEvent struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Status      string `json:"status"`
}

// eventRoutingKey is the routing key of the events on the events exchange.
const eventRoutingKey = "payment.completed"

func writePayment(ctx context.Context, tx pgx.Tx, events string, p Payment) error {
	if _, err := tx.Exec(ctx,
		`INSERT INTO payments (order_id, amount_cents, currency) VALUES ($1, $2, $3)`,
		p.OrderID, p.AmountCents, p.Currency); err != nil {
		return fmt.Errorf("insert payment %s: %w", p.OrderID, err)
	}
	if _, err := tx.Exec(ctx,
		`INSERT INTO ledger_entries (order_id, amount_cents) VALUES ($1, $2)`,
		p.OrderID, p.AmountCents); err != nil {
		return fmt.Errorf("insert ledger entry %s: %w", p.OrderID, err)
	}
	body, err := json.Marshal(completedEvent{OrderID: p.OrderID, AmountCents: p.AmountCents, Currency: p.Currency, Status: "completed"})
	if err != nil {
		return fmt.Errorf("encode event %s: %w", p.OrderID, err)
	}
	// The message id derives from the key: a re-run enqueues nothing new,
	// and a relay crash between publish and mark only repeats the same id.
	return outbox.Enqueue(ctx, tx, outbox.Message{
		Exchange:       events,
		RoutingKey:     eventRoutingKey,
		IdempotencyKey: p.IdempotencyKey(),
		ContentType:    "application/json",
		Body:           body,
	})
}

// declareEvents declares the durable topic exchange the payment.completed
// events go to; subscribers bind their own queues to it. ctx bounds the
// dial and the AMQP handshake.
func declareEvents(ctx context.Context, cfg config) error {
	conn, err := amqp.DialConfig(cfg.AMQPURL, amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if deadline, ok := ctx.Deadline(); ok {
			_ = c.SetDeadline(deadline) // the handshake's; cleared once open
		}
		return c, nil
	}})
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("events exchange: %w", err)
	}
	defer ch.Close()
	if err := ch.ExchangeDeclare(cfg.EventsExchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare events exchange %s: %w", cfg.EventsExchange, err)
	}
	return nil
}
