package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/metrics"
	"github.com/inboxmq/inboxmq/middleware"
	"github.com/inboxmq/inboxmq/observe"
)

// stopTimeout bounds the graceful stop: the contract promises exit within
// 30 s of SIGTERM, and the consumer's soft stop (10 s) fits well inside.
const stopTimeout = 25 * time.Second

// gatewayReasons are the retry reasons this worker adds; metrics
// pre-initialises them so dashboards see zeros from start-up.
var gatewayReasons = []string{reasonGateway5xx, reasonGateway4xx, reasonGatewayTimeout, reasonGateway429, reasonGatewayNetwork}

// run wires the worker and consumes until ctx ends (SIGINT or SIGTERM), then
// stops: no new deliveries, in-flight ones finish or are requeued un-acked.
func run(ctx context.Context, cfg config) error {
	logger, err := zap.NewProduction() // JSON on stderr
	if err != nil {
		return fmt.Errorf("logger: %w", err)
	}
	defer func() { _ = logger.Sync() }()

	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("connect %s: %w", redactURL(cfg.DatabaseURL), err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("connect %s: %w", redactURL(cfg.DatabaseURL), err)
	}

	store, err := inbox.NewStore(ctx, pool, &inbox.StoreConfig{Logger: logger})
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := metrics.New(reg, &metrics.Config{
		ExtraReasons: gatewayReasons,
		Inbox:        &metrics.InboxConfig{DB: pool},
	})
	if err != nil {
		return err
	}
	m.Init(cfg.Queue, cfg.Queue)

	rdb, err := redisClient(cfg.RedisURL)
	if err != nil {
		return err
	}
	defer rdb.Close()

	router, err := newRouter(store, rdb, m, logger, cfg)
	if err != nil {
		return err
	}
	c, err := consumer.New(&consumer.Config{
		URL:       cfg.AMQPURL,
		Router:    router,
		Logger:    logger,
		Observers: []consumer.Observer{m, middleware.NewLogObserver(logger, nil)},
	})
	if err != nil {
		return err
	}

	srv := observe.NewServer(&observe.ServerConfig{
		Addr:     cfg.MetricsAddr,
		Gatherer: reg,
		Checks: []observe.Check{
			observe.Ready("broker", c.Ready),
			observe.Ping("database", pool),
			observe.DegradedFlag("redis", m.RedisDegraded),
		},
	})
	if err := srv.Start(ctx); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()

	if err := c.Start(ctx); err != nil {
		return err
	}
	logger.Info("payment-worker consuming",
		zap.String("queue", cfg.Queue),
		zap.Bool("gateway", cfg.GatewayURL != ""),
		zap.String("amqp_url", redactURL(cfg.AMQPURL)),
		zap.String("metrics_addr", cfg.MetricsAddr))

	select {
	case <-ctx.Done():
	case <-c.Stopped():
		return errors.New("consumer stopped unexpectedly")
	}
	logger.Info("payment-worker stopping")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
	defer cancel()
	if err := c.Stop(sctx); err != nil {
		return err
	}
	logger.Info("payment-worker stopped")
	return nil
}

// redisClient builds the Redis client. It does not ping: Redis is an
// accelerator, and the lock and cache middleware degrade to PostgreSQL alone
// while it is unreachable.
func redisClient(rawURL string) (redis.UniversalClient, error) {
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL %q: %w", redactURL(rawURL), errors.New("not a redis:// or rediss:// URL"))
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
func newRouter(store *inbox.Store, rdb redis.UniversalClient, m *metrics.Metrics, logger *zap.Logger, cfg config) (*consumer.Router, error) {
	router := consumer.NewRouter()
	router.Use(middleware.Recover(&middleware.RecoverOpts{Logger: logger}))

	dedupe := middleware.Dedupe(rdb, &middleware.DedupeOpts{Logger: logger, OnDegraded: m.SetRedisDegraded})
	lck := middleware.Lock(rdb, &middleware.LockOpts{TTL: cfg.LockTTL, Logger: logger, OnDegraded: m.SetRedisDegraded})
	opts := &consumer.HandlerOpts{
		Middleware: []consumer.Middleware{dedupe, lck},
		Queue:      consumer.QueueOpts{Concurrency: cfg.Concurrency},
	}

	var h consumer.Handler[Payment]
	if cfg.GatewayURL == "" {
		h = inbox.Handler(store, recordPayment, nil)
	} else {
		gw := &Gateway{BaseURL: cfg.GatewayURL}
		h = inbox.ClaimHandler(store, chargeAndRecord(gw), nil)
	}
	if err := consumer.RegisterSafely(router, cfg.Queue, h, opts); err != nil {
		return nil, err
	}
	return router, nil
}

// recordPayment is the transactional handler: the payment and its ledger
// entry are written in the transaction that records the inbox row, so they
// commit together or not at all.
func recordPayment(ctx context.Context, tx pgx.Tx, msg *consumer.Message[Payment]) error {
	return writePayment(ctx, tx, msg.Body)
}

// chargeAndRecord is the claim-mode handler: the charge happens outside
// PostgreSQL, so the key is claimed first, the gateway is called with the
// claim's key, and the completion commits the business writes only if the
// claim still holds.
func chargeAndRecord(gw *Gateway) inbox.ClaimFunc[Payment] {
	return func(ctx context.Context, claim *inbox.Claim, msg *consumer.Message[Payment]) error {
		// A recorded step is skipped on a later attempt: a crash between the
		// charge and the completion does not even repeat the call (and if
		// it did, the gateway would see the same Idempotency-Key).
		if _, err := claim.Step(ctx, "charge", func(ctx context.Context) (any, error) {
			return nil, gw.Charge(ctx, claim.Key, msg.Body)
		}); err != nil {
			return err
		}
		return claim.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error {
			return writePayment(ctx, tx, msg.Body)
		})
	}
}

func writePayment(ctx context.Context, tx pgx.Tx, p Payment) error {
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
	return nil
}
