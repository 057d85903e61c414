package main

import (
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/middleware"
)

// config is the worker's configuration, read from the environment (see the
// README's table); command-line flags may override it.
type config struct {
	AMQPURL     string
	DatabaseURL string
	RedisURL    string
	Queue       string
	GatewayURL  string
	LockTTL     time.Duration
	// Lock says whether a payment takes the Redis lock (LOCK): auto (the
	// framework's default: no lock), on or off.
	Lock inboxmq.LockMode
	// Concurrency is the handlers at once (WORKER_CONCURRENCY); 0 with
	// GROUP_COMMIT=on unless set: the route picks enough to fill its
	// batches.
	Concurrency int
	MetricsAddr string
	// GroupCommit lets deliveries handled concurrently share one
	// transaction (GROUP_COMMIT=on): in transactional mode the whole
	// handler, in claim mode the completions.
	GroupCommit bool
	// EventsExchange receives a payment.completed event per new payment,
	// through the transactional outbox (PAYMENT_EVENTS_EXCHANGE).
	EventsExchange string
	// FaultEvents publishes a payment.failed event on EventsExchange for
	// every dead-lettered payment (FAULT_EVENTS=on).
	FaultEvents bool
	// ConnectTimeout bounds each wait for PostgreSQL and RabbitMQ at
	// start-up, and each new database connection (CONNECT_TIMEOUT).
	ConnectTimeout time.Duration
	// QueueType is the type of the work queue, its DLQ and its retry
	// queues (QUEUE_TYPE): quorum (replicated, the choice for a cluster)
	// or classic.
	QueueType consumer.QueueType
	// DeliveryLimit is the quorum queue's x-delivery-limit
	// (DELIVERY_LIMIT): how often the broker hands out one message before
	// it dead-letters it, the backstop against a message that crashes or
	// disconnects every worker that takes it.
	DeliveryLimit int
	// Breaker puts the payments behind a circuit breaker on the gateway
	// (BREAKER=on), with BREAKER_WINDOW, BREAKER_THRESHOLD,
	// BREAKER_MIN_CALLS and BREAKER_COOLDOWN; nil when off.
	Breaker *middleware.BreakerOpts
	// GatewayRateLimit is the calls per second allowed to the gateway
	// across all workers (GATEWAY_RATE_LIMIT; 0: no limit), each worker
	// keeping to 1/GatewayWorkers of it while Redis is down
	// (GATEWAY_WORKERS).
	GatewayRateLimit float64
	GatewayWorkers   int

	// OrderedShards, when positive, consumes the payments through that
	// many shard queues with per-order order across workers
	// (ORDERED_SHARDS; 0: one work queue). Publishers then send to the
	// exchange named after the queue with the order id as routing key.
	OrderedShards int
}

// Defaults, as documented in the README.
const (
	defaultAMQPURL     = "amqp://guest:guest@127.0.0.1:5672/"
	defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	defaultRedisURL    = "redis://127.0.0.1:6379/0"
	defaultQueue       = "payments.requested"
	defaultLockTTL     = 30 * time.Second
	defaultConcurrency = 8
	defaultMetricsAddr = "127.0.0.1:9464"
	defaultEvents      = "payments.events"
	defaultConnect     = 30 * time.Second
	defaultQueueType   = consumer.Quorum
	// defaultDeliveryLimit leaves room for the redeliveries of a rolling
	// restart; handler failures never count (each retry is a new copy).
	defaultDeliveryLimit = 20
)

// configFromEnv reads the configuration from the environment (getenv is
// os.Getenv outside tests).
func configFromEnv(getenv func(string) string) (config, error) {
	c := config{
		AMQPURL:     cmp.Or(getenv("AMQP_URL"), defaultAMQPURL),
		DatabaseURL: cmp.Or(getenv("DATABASE_URL"), defaultDatabaseURL),
		RedisURL:    cmp.Or(getenv("REDIS_URL"), defaultRedisURL),
		Queue:       cmp.Or(getenv("PAYMENT_QUEUE"), defaultQueue),
		GatewayURL:  getenv("GATEWAY_URL"),
		LockTTL:     defaultLockTTL,
		Concurrency: defaultConcurrency,
		MetricsAddr: cmp.Or(getenv("METRICS_ADDR"), defaultMetricsAddr),

		EventsExchange: cmp.Or(getenv("PAYMENT_EVENTS_EXCHANGE"), defaultEvents),
		ConnectTimeout: defaultConnect,
		QueueType:      defaultQueueType,
		DeliveryLimit:  defaultDeliveryLimit,
	}
	switch v := getenv("QUEUE_TYPE"); v {
	case "":
	case string(consumer.Quorum), string(consumer.Classic):
		c.QueueType = consumer.QueueType(v)
	default:
		return c, fmt.Errorf("QUEUE_TYPE %q: want quorum or classic", v)
	}
	if v := getenv("DELIVERY_LIMIT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return c, fmt.Errorf("DELIVERY_LIMIT %q: want a positive integer (deliveries of one message before the broker dead-letters it)", v)
		}
		c.DeliveryLimit = n
	}
	if v := getenv("LOCK_TTL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < middleware.MinLockTTL || d > middleware.MaxLockTTL {
			return c, fmt.Errorf("LOCK_TTL %q: want a Go duration from %s to %s, such as 30s", v, middleware.MinLockTTL, middleware.MaxLockTTL)
		}
		c.LockTTL = d
	}
	switch v := getenv("LOCK"); v {
	case "", "auto":
	case "on":
		c.Lock = inboxmq.LockOn
	case "off":
		c.Lock = inboxmq.LockOff
	default:
		return c, fmt.Errorf("LOCK %q: want auto, on or off", v)
	}
	switch v := getenv("GROUP_COMMIT"); v {
	case "", "off":
	case "on":
		c.GroupCommit = true
	default:
		return c, fmt.Errorf("GROUP_COMMIT %q: want on or off", v)
	}
	switch v := getenv("FAULT_EVENTS"); v {
	case "", "off":
	case "on":
		c.FaultEvents = true
	default:
		return c, fmt.Errorf("FAULT_EVENTS %q: want on or off", v)
	}
	if c.GroupCommit {
		// 0: the route's default with group commit, enough handlers to
		// fill its batches (inboxmq.RouteOpts.Queue).
		c.Concurrency = 0
	}
	if v := getenv("WORKER_CONCURRENCY"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return c, fmt.Errorf("WORKER_CONCURRENCY %q: want a positive integer", v)
		}
		c.Concurrency = n
	}
	if err := c.resilienceFromEnv(getenv); err != nil {
		return c, err
	}
	// Ordered consumption (docs/scaling.md, "Ordering").
	if v := getenv("ORDERED_SHARDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 1024 {
			return c, fmt.Errorf("ORDERED_SHARDS %q: want 0 (off) to 1024", v)
		}
		c.OrderedShards = n
	}
	if v := getenv("CONNECT_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return c, fmt.Errorf("CONNECT_TIMEOUT %q: want a positive Go duration such as 30s", v)
		}
		c.ConnectTimeout = d
	}
	return c, c.validate()
}

func (c config) validate() error {
	if !consumer.ValidName(c.Queue) {
		return fmt.Errorf("PAYMENT_QUEUE %q: want 1–200 letters, digits or . _ : -", c.Queue)
	}
	if !consumer.ValidName(c.EventsExchange) {
		return fmt.Errorf("PAYMENT_EVENTS_EXCHANGE %q: want 1–200 letters, digits or . _ : -", c.EventsExchange)
	}
	if c.GatewayURL != "" {
		u, err := url.Parse(c.GatewayURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return errors.New("GATEWAY_URL: want an http:// or https:// URL with a host")
		}
	}
	return nil
}

// resilienceFromEnv reads the breaker's and the rate limit's settings.
func (c *config) resilienceFromEnv(getenv func(string) string) error {
	switch v := getenv("BREAKER"); v {
	case "", "off":
	case "on":
		c.Breaker = &middleware.BreakerOpts{Downstream: "gateway"}
	default:
		return fmt.Errorf("BREAKER %q: want on or off", v)
	}
	var window, coolDown time.Duration
	for name, dst := range map[string]*time.Duration{"BREAKER_WINDOW": &window, "BREAKER_COOLDOWN": &coolDown} {
		if v := getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return fmt.Errorf("%s %q: want a positive Go duration such as 30s", name, v)
			}
			*dst = d
		}
	}
	if c.Breaker != nil {
		c.Breaker.Window, c.Breaker.CoolDown = window, coolDown
	}
	if v := getenv("BREAKER_THRESHOLD"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 || f > 1 {
			return fmt.Errorf("BREAKER_THRESHOLD %q: want a share above 0, at most 1, such as 0.5", v)
		}
		if c.Breaker != nil {
			c.Breaker.Threshold = f
		}
	}
	if v := getenv("BREAKER_MIN_CALLS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("BREAKER_MIN_CALLS %q: want a positive integer", v)
		}
		if c.Breaker != nil {
			c.Breaker.MinCalls = n
		}
	}
	if v := getenv("GATEWAY_RATE_LIMIT"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 {
			return fmt.Errorf("GATEWAY_RATE_LIMIT %q: want calls per second, 0 for no limit", v)
		}
		c.GatewayRateLimit = f
	}
	if v := getenv("GATEWAY_WORKERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("GATEWAY_WORKERS %q: want a positive integer", v)
		}
		c.GatewayWorkers = n
	}
	return nil
}

// getenv is the environment lookup used by the commands.
var getenv = os.Getenv
