package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/metrics"
	"github.com/inboxmq/inboxmq/middleware"
	"github.com/inboxmq/inboxmq/outbox"
)

// gatewayReasons are the retry reasons this worker adds; metrics
// pre-initialises them so dashboards see zeros from start-up.
var gatewayReasons = []string{reasonGateway5xx, reasonGateway4xx, reasonGatewayTimeout, reasonGateway429, reasonGatewayNetwork}

// run consumes until ctx ends (SIGINT or SIGTERM), then stops: no new
// deliveries, in-flight ones finish or are requeued un-acked.
func run(ctx context.Context, cfg config) error {
	// JSON on stderr. zap's own sampling is off, so every line inboxmq
	// writes reaches stderr; inboxmq samples its per-delivery success lines
	// (received, locked, processing, completed) past 100 per second per
	// status, and never its duplicate, retry, failure and dead-letter
	// lines. The inbox row (inboxctl status) is the record of every
	// success; docs/observability.md says why.
	zcfg := zap.NewProductionConfig()
	zcfg.Sampling = nil
	logger, err := zcfg.Build()
	if err != nil {
		return fmt.Errorf("logger: %w", err)
	}
	defer func() { _ = logger.Sync() }()
	// inboxmq logs through log/slog; zapslog makes this zap logger its
	// backend, so every line is the same zap JSON. No stack traces from the
	// handler: inboxmq's lines carry the one they need (a panic's, in
	// "stack"), and its error lines are expected outcomes.
	slogger := slog.New(zapslog.NewHandler(logger.Core(),
		zapslog.WithCaller(true), zapslog.AddStacktraceAt(slog.Level(math.MaxInt))))
	tr, err := setupTracing(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err := tr.flush(); err != nil {
			logger.Warn("tracing: flush failed", zap.Error(err))
		}
	}()
	pool, err := openPool(cfg, tr)
	if err != nil {
		return err
	}
	defer pool.Close()
	rdb, err := redisClient(cfg.RedisURL)
	if err != nil {
		return err
	}
	defer rdb.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// The worker owns the rest: /metrics, /healthz and /readyz come up
	// first and name what start-up waits for; the consumer stops first.
	w, err := inboxmq.NewWorker(&inboxmq.Config{
		URL: cfg.AMQPURL, DB: pool, Redis: rdb, Routes: newRoutes(cfg, tr), Logger: slogger,
		Tracing:        &inboxmq.TracingConfig{TracerProvider: tr.tp},
		ConnectTimeout: cfg.ConnectTimeout,
		Metrics:        &inboxmq.MetricsConfig{Registerer: reg, Series: &metrics.Config{ExtraReasons: gatewayReasons}},
		Health:         &inboxmq.HealthConfig{Addr: cfg.MetricsAddr},
		Controls:       &inboxmq.ControlsConfig{ParkerName: "payment-worker-parker"},
		Outbox: &inboxmq.OutboxConfig{
			// An event nobody subscribed to is dropped, not retried forever.
			Relay:     outbox.RelayConfig{ConnectionName: "payment-worker-outbox", AllowUnroutable: true},
			Exchanges: []inboxmq.Exchange{{Name: cfg.EventsExchange}},
		},
		Reconciler: &inbox.ReconcilerConfig{},
		Retention:  &inbox.RetentionConfig{},
	})
	if err != nil {
		return err
	}
	if err := w.Start(ctx); err != nil {
		return connectTimeout(err)
	}
	logger.Info("payment-worker consuming",
		zap.String("queue", cfg.Queue),
		zap.String("queue_type", string(cfg.QueueType)),
		zap.Bool("gateway", cfg.GatewayURL != ""),
		zap.Bool("group_commit", cfg.GroupCommit),
		zap.String("amqp_url", consumer.RedactURL(cfg.AMQPURL)),
		zap.String("metrics_addr", cfg.MetricsAddr))
	if err := w.Wait(ctx); err != nil {
		return err
	}
	logger.Info("payment-worker stopped")
	return nil
}

// openPool builds the pool of DATABASE_URL; it connects on first use (the
// caller bounds that wait). The URL may list several hosts (the primary and
// its standbys): inbox.ConfigurePool keeps every connection on the writable
// primary, across a fail-over too. Unless the URL sets pool_max_conns, the pool is
// sized for the handlers plus the background services (outbox relay,
// LISTEN connections, reconciler, retention, metrics); unless it sets
// connect_timeout, each new connection is bounded by CONNECT_TIMEOUT.
func openPool(cfg config, tr *tracing) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		// The parse error may echo the URL: never wrap it.
		return nil, fmt.Errorf("DATABASE_URL %s: not a valid PostgreSQL URL", consumer.RedactURL(cfg.DatabaseURL))
	}
	if !strings.Contains(cfg.DatabaseURL, "pool_max_conns") {
		// With group commit (Concurrency 0) the handlers share a few
		// connections: the batches in flight.
		pcfg.MaxConns = int32(min(cmp.Or(cfg.Concurrency, defaultConcurrency)+8, 200)) //nolint:gosec // bounded above
	}
	if pcfg.ConnConfig.ConnectTimeout == 0 {
		pcfg.ConnConfig.ConnectTimeout = cfg.ConnectTimeout
	}
	tr.tracePool(pcfg)
	if err := inbox.ConfigurePool(pcfg); err != nil {
		return nil, fmt.Errorf("DATABASE_URL %s: %w", consumer.RedactURL(cfg.DatabaseURL), err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", consumer.RedactURL(cfg.DatabaseURL), err)
	}
	return pool, nil
}

// redisClient builds the Redis client of REDIS_URL: a single server, a
// Sentinel-managed primary or a cluster (see inboxmq.RedisFromURL). It does
// not ping: Redis is an
// accelerator, and the lock and cache middleware degrade to PostgreSQL alone
// while it is unreachable.
func redisClient(rawURL string) (redis.UniversalClient, error) {
	rdb, err := inboxmq.RedisFromURL(rawURL, &inboxmq.RedisOpts{
		DialTimeout:  500 * time.Millisecond,
		ReadTimeout:  500 * time.Millisecond,
		WriteTimeout: 500 * time.Millisecond,
	})
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	return rdb, nil
}

// newRoutes registers the payment handler: transactional mode without a
// gateway, claim mode with one. The Redis lock is taken only with LOCK=on
// (the inbox keeps copies apart in both modes). A copy that finds the key
// locked waits 1s at first: a payment commits in milliseconds, so by then
// the copy is acked as a duplicate.
func newRoutes(cfg config, tr *tracing) *inboxmq.Routes {
	routes := inboxmq.NewRoutes()
	opts := &inboxmq.RouteOpts{
		Queue:    consumer.QueueOpts{Concurrency: cfg.Concurrency, Type: cfg.QueueType, DeliveryLimit: cfg.DeliveryLimit},
		LockMode: cfg.Lock,
		Lock:     &middleware.LockOpts{TTL: cfg.LockTTL, RetryDelay: time.Second},
		// A request (reply_to) gets the payment's stored result, the
		// first copy and every duplicate alike.
		Reply: true,
	}
	if cfg.FaultEvents {
		// A declined or exhausted payment is announced through the
		// outbox, once, when it is dead-lettered.
		opts.Faults = &inboxmq.FaultOpts{Exchange: cfg.EventsExchange, RoutingKey: failedRoutingKey}
	}
	if cfg.GroupCommit {
		// The handler is pure database work, so its batches are
		// pipelined (no savepoints), which lets the route take up to 256
		// per transaction (2ms, 2 in flight); with WORKER_CONCURRENCY
		// unset (Concurrency 0) it runs 512 handlers, enough to fill
		// them (inboxmq.RouteOpts.GroupCommit).
		opts.GroupCommit = &inbox.GroupCommit{Pipeline: true}
	}
	if cfg.OrderedShards > 0 {
		// One order's payments apply in publish order, on any worker.
		opts.Ordered = &consumer.OrderedOpts{Shards: cfg.OrderedShards}
	}
	opts.Breaker = cfg.Breaker // nil unless BREAKER=on
	if cfg.GatewayRateLimit > 0 {
		// The limit belongs to the gateway: every worker calling the same
		// host shares it (one Redis key per host).
		downstream := "gateway"
		if u, err := url.Parse(cfg.GatewayURL); err == nil && u.Host != "" {
			downstream = "gateway:" + u.Host
		}
		opts.RateLimit = &middleware.RateLimitOpts{
			Downstream: downstream, Rate: cfg.GatewayRateLimit, ExpectedWorkers: cfg.GatewayWorkers,
		}
	}
	if cfg.GatewayURL == "" {
		inboxmq.HandleBatch(routes, cfg.Queue, recordPayment(cfg.EventsExchange), opts)
	} else {
		inboxmq.HandleClaim(routes, cfg.Queue, chargeAndRecord(&Gateway{BaseURL: cfg.GatewayURL, Client: tr.httpClient()}, cfg.EventsExchange), opts)
	}
	return routes
}

// recordPayment is the transactional handler: the payment, its ledger
// entry and its payment.completed event are written in the transaction that
// records the inbox row, so they commit together or not at all. It only
// queues them (a batch handler): the inbox sends the claim of the key, the
// three writes and the result in one round trip. A handler that must read
// before it writes (a balance, a stock level) is a HandleTx handler
// instead, with the transaction itself.
func recordPayment(events string) inbox.BatchHandlerFunc[Payment] {
	return func(ctx context.Context, b *pgx.Batch, msg *inboxtype.Message[Payment]) error {
		if err := queuePayment(ctx, b, events, msg.Body, nil); err != nil {
			return err
		}
		return msg.SetResult(paymentResult{OrderID: msg.Body.OrderID, Status: "completed"})
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
		raw, err := claim.Step(ctx, "charge", func(ctx context.Context) (any, error) {
			return gw.Charge(ctx, claim.Key, msg.Body)
		})
		if err != nil {
			return err
		}
		var chargeID string
		_ = json.Unmarshal(raw, &chargeID) // a step recorded as null: no id
		return claim.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error {
			entry, err := writePayment(ctx, tx, events, msg.Body)
			if err != nil {
				return err
			}
			// The gateway's answer is stored with the payment, in the
			// completion's transaction.
			return msg.SetResult(paymentResult{OrderID: msg.Body.OrderID, Status: "completed", ChargeID: chargeID, LedgerEntryID: entry})
		})
	}
}

// paymentResult is the result stored with each payment and carried by the
// reply to every copy of a request (reply_to): the first and each
// duplicate get the same bytes.
type paymentResult struct {
	OrderID string `json:"order_id"`
	Status  string `json:"status"`
	// ChargeID is the gateway's id of the charge (claim mode).
	ChargeID string `json:"charge_id,omitempty"`
	// LedgerEntryID is the id of the payment's ledger entry (claim mode,
	// whose completion reads it back in its transaction).
	LedgerEntryID int64 `json:"ledger_entry_id,omitempty"`
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

// failedRoutingKey is the routing key of the fault events (an
// inboxmq.FaultEvent body) on the events exchange (FAULT_EVENTS=on).
const failedRoutingKey = "payment.failed"

// writePayment writes the payment, its ledger entry and its event in tx,
// in one round trip, and returns the ledger entry's id.
func writePayment(ctx context.Context, tx pgx.Tx, events string, p Payment) (int64, error) {
	b := &pgx.Batch{}
	var entry int64
	if err := queuePayment(ctx, b, events, p, &entry); err != nil {
		return 0, err
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return 0, fmt.Errorf("record payment %s: %w", p.OrderID, err)
	}
	return entry, nil
}

// queuePayment queues the payment, its ledger entry and its event in b;
// entry, when set, receives the ledger entry's id once b has run.
func queuePayment(ctx context.Context, b *pgx.Batch, events string, p Payment, entry *int64) error {
	body, err := json.Marshal(completedEvent{OrderID: p.OrderID, AmountCents: p.AmountCents, Currency: p.Currency, Status: "completed"})
	if err != nil {
		return fmt.Errorf("encode event %s: %w", p.OrderID, err)
	}
	b.Queue(`INSERT INTO payments (order_id, amount_cents, currency) VALUES ($1, $2, $3)`,
		p.OrderID, p.AmountCents, p.Currency)
	if entry != nil {
		b.Queue(`INSERT INTO ledger_entries (order_id, amount_cents) VALUES ($1, $2) RETURNING id`,
			p.OrderID, p.AmountCents).QueryRow(func(row pgx.Row) error { return row.Scan(entry) })
	} else {
		b.Queue(`INSERT INTO ledger_entries (order_id, amount_cents) VALUES ($1, $2)`, p.OrderID, p.AmountCents)
	}
	// The message id derives from the key: a re-run enqueues nothing new,
	// and a relay crash between publish and mark only repeats the same id.
	return outbox.AddToBatch(ctx, b, outbox.Message{
		Exchange:       events,
		RoutingKey:     eventRoutingKey,
		IdempotencyKey: p.IdempotencyKey(),
		ContentType:    "application/json",
		Body:           body,
	})
}
