// Command payment-worker is the inboxmq example: a worker that records
// payments so that a duplicate delivery never charges or books twice.
// `migrate` applies the embedded migrations (safe to repeat); `run`
// consumes PAYMENT_QUEUE until SIGINT or SIGTERM. Settings: README.md.
package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"golang.org/x/net/http/httpguts"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/migrations"
	"github.com/inboxmq/inboxmq/outbox"
	"github.com/inboxmq/inboxmq/retry"
)

// Payment is a payment request; its business identity is OrderID.
type Payment struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// IdempotencyKey implements inboxtype.Keyer: the order's, whatever the copy.
func (p Payment) IdempotencyKey() string { return "payment:" + p.OrderID }

// Fingerprint implements inboxtype.Fingerprinter: a re-encoded copy is a
// duplicate; the order_id with another amount or currency, a key conflict.
func (p Payment) Fingerprint() []byte {
	sum := sha256.Sum256(fmt.Appendf(nil, "%d:%s|%d|%s", len(p.OrderID), p.OrderID, p.AmountCents, strings.ToUpper(p.Currency)))
	return sum[:]
}

// Validate implements inboxtype.Validator: an invalid payment is dead-lettered
// at once (so is a key that is not UTF-8 or has a control character).
func (p Payment) Validate() error {
	var errs []error
	if strings.TrimSpace(p.OrderID) == "" || len(p.OrderID) > 200 {
		errs = append(errs, errors.New("order_id is missing, only whitespace or longer than 200 bytes"))
	}
	if p.AmountCents <= 0 {
		errs = append(errs, fmt.Errorf("amount_cents %d is missing or not positive", p.AmountCents))
	}
	if len(p.Currency) != 3 || strings.Trim(strings.ToUpper(p.Currency), "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "" {
		errs = append(errs, fmt.Errorf("currency %q is not three letters", p.Currency))
	}
	return errors.Join(errs...)
}

// paymentResult is stored with a payment: a request (reply_to) gets it.
type paymentResult struct {
	OrderID       string `json:"order_id"`
	Status        string `json:"status"`
	ChargeID      string `json:"charge_id,omitempty"`       // claim mode: the gateway's id
	LedgerEntryID int64  `json:"ledger_entry_id,omitempty"` // claim mode: read back at completion
}

// recordPayment is the transactional handler: the inbox sends the writes
// it queues with the key's claim in one round trip, one transaction.
func recordPayment(events string) inbox.BatchHandlerFunc[Payment] {
	return func(ctx context.Context, b *pgx.Batch, msg *inboxtype.Message[Payment]) error {
		if err := queuePayment(ctx, b, events, msg.Body, nil); err != nil {
			return err
		}
		return msg.SetResult(paymentResult{OrderID: msg.Body.OrderID, Status: "completed"})
	}
}

// chargeAndRecord is the claim-mode handler: the gateway is charged under the
// claimed key, once (a retry reuses the step), and the rows commit only while
// the claim holds.
func chargeAndRecord(gw *Gateway, events string) inbox.ClaimFunc[Payment] {
	return func(ctx context.Context, claim *inbox.Claim, msg *inboxtype.Message[Payment]) error {
		raw, err := claim.Step(ctx, "charge", func(ctx context.Context) (any, error) {
			return gw.Charge(ctx, claim.Key, msg.Body)
		})
		if err != nil {
			return err
		}
		r := paymentResult{OrderID: msg.Body.OrderID, Status: "completed"}
		_ = json.Unmarshal(raw, &r.ChargeID)
		return claim.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error {
			b := &pgx.Batch{}
			if err := queuePayment(ctx, b, events, msg.Body, &r.LedgerEntryID); err != nil {
				return err
			}
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
			return msg.SetResult(r)
		})
	}
}

// queuePayment queues the payment, its ledger entry (its id to entry) and
// a payment.completed event in the outbox, relayed after the commit.
func queuePayment(ctx context.Context, b *pgx.Batch, events string, p Payment, entry *int64) error {
	b.Queue(`INSERT INTO payments (order_id, amount_cents, currency) VALUES ($1, $2, $3)`, p.OrderID, p.AmountCents, p.Currency)
	ledger := b.Queue(`INSERT INTO ledger_entries (order_id, amount_cents) VALUES ($1, $2) RETURNING id`, p.OrderID, p.AmountCents)
	if entry != nil {
		ledger.QueryRow(func(row pgx.Row) error { return row.Scan(entry) })
	}
	body, _ := json.Marshal(map[string]any{"order_id": p.OrderID, "amount_cents": p.AmountCents, "currency": p.Currency, "status": "completed"})
	return outbox.AddToBatch(ctx, b, outbox.Message{Exchange: events, RoutingKey: "payment.completed",
		IdempotencyKey: p.IdempotencyKey(), ContentType: "application/json", Body: body})
}

// Gateway charges at BaseURL+"/charges" with Client (or http.DefaultClient) within Timeout (or 10s).
type Gateway struct {
	BaseURL string
	Client  *http.Client
	Timeout time.Duration
}

// Charge posts p with header Idempotency-Key: key and returns the answer's
// "id". Its error is retryable on 5xx, 408, 429, a timeout or a network
// error, else permanent, with a reason (gateway_5xx…); a request net/http
// would refuse is permanent ("invalid"), before any network I/O.
func (g *Gateway) Charge(ctx context.Context, key string, p Payment) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(g.Timeout, 10*time.Second))
	defer cancel()
	body, _ := json.Marshal(p)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(g.BaseURL, "/")+"/charges", bytes.NewReader(body))
	if err == nil && (req.URL.Scheme != "http" && req.URL.Scheme != "https" || req.URL.Host == "" || !httpguts.ValidHeaderFieldValue(key)) {
		err = errors.New("want an http(s) URL with a host and a key without control characters")
	}
	if err != nil {
		return "", retry.WithReason(retry.ReasonInvalid, retry.Permanent(fmt.Errorf("gateway: charge %s: %w", p.OrderID, err)))
	}
	req.Header = http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {key}}
	resp, err := cmp.Or(g.Client, http.DefaultClient).Do(req)
	if err != nil {
		err = fmt.Errorf("gateway: charge %s: %w", p.OrderID, err)
		var t interface{ Timeout() bool }
		switch {
		case errors.Is(ctx.Err(), context.Canceled):
			return "", err // our own cancellation (a stop, a lost lease), not a gateway failure
		case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &t) && t.Timeout():
			return "", retry.WithReason("gateway_timeout", retry.Retryable(err))
		}
		return "", retry.WithReason("gateway_network", retry.Retryable(err))
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	err = fmt.Errorf("gateway: charge %s: HTTP %d %s", p.OrderID, resp.StatusCode, bytes.TrimSpace(answer))
	wait, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	switch code := resp.StatusCode; {
	case code == http.StatusTooManyRequests:
		return "", retry.WithReason("gateway_429", retry.After(min(time.Duration(max(wait, 0))*time.Second, 10*time.Minute), err))
	case code == http.StatusRequestTimeout:
		return "", retry.WithReason("gateway_timeout", retry.Retryable(err))
	case code >= 500:
		return "", retry.WithReason("gateway_5xx", retry.Retryable(err))
	case code < 200 || code > 299:
		return "", retry.WithReason("gateway_4xx", retry.Permanent(err))
	}
	var charge struct{ ID string }
	_ = json.Unmarshal(answer, &charge)
	return charge.ID, nil
}

// config is read with caarlos0/env (tests parse maps in parallel); want says what a value takes.
type config struct {
	AMQPURL          string            `env:"AMQP_URL" envDefault:"amqp://guest:guest@127.0.0.1:5672/"`
	DatabaseURL      string            `env:"DATABASE_URL" envDefault:"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"`
	RedisURL         string            `env:"REDIS_URL" envDefault:"redis://127.0.0.1:6379/0"`
	Queue            string            `env:"PAYMENT_QUEUE" envDefault:"payments.requested" want:"1–200 letters, digits or . _ : -"`
	Events           string            `env:"PAYMENT_EVENTS_EXCHANGE" envDefault:"payments.events" want:"1–200 letters, digits or . _ : -"`
	GatewayURL       string            `env:"GATEWAY_URL" want:"an http:// or https:// URL with a host"`
	Lock             string            `env:"LOCK" envDefault:"auto" want:"auto, on or off"`
	LockTTL          time.Duration     `env:"LOCK_TTL" envDefault:"30s" want:"a Go duration from 1s to 10m0s, such as 30s"`
	Concurrency      int               `env:"WORKER_CONCURRENCY" envDefault:"8" want:"a positive integer"`
	GroupCommit      string            `env:"GROUP_COMMIT" envDefault:"off" want:"on or off"`
	FaultEvents      string            `env:"FAULT_EVENTS" envDefault:"off" want:"on or off"`
	MetricsAddr      string            `env:"METRICS_ADDR" envDefault:"127.0.0.1:9464"`
	ConnectTimeout   time.Duration     `env:"CONNECT_TIMEOUT" envDefault:"30s" want:"a positive Go duration such as 30s"`
	QueueType        inboxmq.QueueType `env:"QUEUE_TYPE" envDefault:"quorum" want:"quorum or classic"`
	DeliveryLimit    int               `env:"DELIVERY_LIMIT" envDefault:"20" want:"a positive integer"`
	OrderedShards    int               `env:"ORDERED_SHARDS" want:"0 (off) to 1024"`
	Breaker          string            `env:"BREAKER" envDefault:"off" want:"on or off"`
	BreakerWindow    time.Duration     `env:"BREAKER_WINDOW" envDefault:"30s" want:"a positive Go duration such as 30s"`
	BreakerThreshold float64           `env:"BREAKER_THRESHOLD" envDefault:"0.5" want:"a share above 0, at most 1, such as 0.5"`
	BreakerMinCalls  int               `env:"BREAKER_MIN_CALLS" envDefault:"10" want:"a positive integer"`
	BreakerCoolDown  time.Duration     `env:"BREAKER_COOLDOWN" envDefault:"15s" want:"a positive Go duration such as 15s"`
	RateLimit        float64           `env:"GATEWAY_RATE_LIMIT" want:"calls per second, 0 for no limit"`
	GatewayWorkers   int               `env:"GATEWAY_WORKERS" envDefault:"1" want:"a positive integer"`
}

// loadConfig reads environ; an error names the variable and what it wants, never its value.
func loadConfig(environ map[string]string) (config, error) {
	c, err := env.ParseAsWithOptions[config](env.Options{Environment: environ}) // err: returned unless a check fails
	bad := func(field string) (config, error) {
		f, _ := reflect.TypeFor[config]().FieldByName(field)
		return c, fmt.Errorf("%s: want %s", f.Tag.Get("env"), f.Tag.Get("want"))
	}
	if pe := (env.ParseError{}); errors.As(err, &pe) {
		return bad(pe.Name)
	}
	name := regexp.MustCompile(`^[A-Za-z0-9._:-]{1,200}$`)
	onOff := func(v string) bool { return v == "on" || v == "off" }
	gw, gwErr := url.Parse(c.GatewayURL)
	for _, check := range []struct {
		field string
		ok    bool
	}{
		{"Queue", name.MatchString(c.Queue)}, {"Events", name.MatchString(c.Events)},
		{"GatewayURL", c.GatewayURL == "" || gwErr == nil && (gw.Scheme == "http" || gw.Scheme == "https") && gw.Host != ""},
		{"Lock", c.Lock == "auto" || onOff(c.Lock)}, {"LockTTL", c.LockTTL >= time.Second && c.LockTTL <= 10*time.Minute},
		{"GroupCommit", onOff(c.GroupCommit)}, {"FaultEvents", onOff(c.FaultEvents)}, {"Breaker", onOff(c.Breaker)},
		{"Concurrency", c.Concurrency > 0}, {"DeliveryLimit", c.DeliveryLimit > 0}, {"ConnectTimeout", c.ConnectTimeout > 0},
		{"QueueType", c.QueueType == inboxmq.Quorum || c.QueueType == inboxmq.Classic}, {"BreakerThreshold", c.BreakerThreshold > 0 && c.BreakerThreshold <= 1},
		{"OrderedShards", c.OrderedShards >= 0 && c.OrderedShards <= 1024}, {"RateLimit", c.RateLimit >= 0}, {"GatewayWorkers", c.GatewayWorkers > 0},
		{"BreakerWindow", c.BreakerWindow > 0}, {"BreakerCoolDown", c.BreakerCoolDown > 0}, {"BreakerMinCalls", c.BreakerMinCalls > 0},
	} {
		if !check.ok {
			return bad(check.field)
		}
	}
	if c.GroupCommit == "on" && environ["WORKER_CONCURRENCY"] == "" {
		c.Concurrency = 0 // the route runs enough handlers to fill its batches
	}
	return c, err
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c, err := loadConfig(env.ToMap(os.Environ()))
	switch cmd := strings.Join(os.Args[1:], " "); {
	case err != nil:
	case cmd == "migrate":
		if err = migrate(ctx, c); err == nil {
			fmt.Println("migrations applied")
		}
	case cmd == "run":
		err = run(ctx, c)
	default:
		err = fmt.Errorf("unknown command %q: want migrate or run", cmd)
	}
	if te := (*inboxmq.StartTimeoutError)(nil); errors.As(err, &te) { // say what to raise
		err = fmt.Errorf("%s at %s did not answer within %s (CONNECT_TIMEOUT): %w", te.Service, te.Addr, te.Timeout, te.Err)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "payment-worker:", err)
		stop()
		os.Exit(1)
	}
}

// run consumes until ctx ends (SIGINT or SIGTERM), then stops gracefully.
func run(ctx context.Context, c config) error {
	zcfg := zap.NewProductionConfig() // zap JSON, through slog below
	zcfg.Sampling = nil               // inboxmq samples its success lines, never the rest
	zl := zap.Must(zcfg.Build())
	defer func() { _ = zl.Sync() }()
	logger := slog.New(zapslog.NewHandler(zl.Core(), zapslog.WithCaller(true), zapslog.AddStacktraceAt(slog.LevelError+1)))
	gw, sqlTracer := &Gateway{BaseURL: c.GatewayURL}, pgx.QueryTracer(nil) // both traced when OTEL_* ask
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")+os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
		exp, err := otlptracehttp.New(ctx) // OTLP over HTTP, set by the standard OTEL_* variables
		if err != nil {
			return err
		}
		name := attribute.String("service.name", cmp.Or(os.Getenv("OTEL_SERVICE_NAME"), "payment-worker")) // with OTEL_RESOURCE_ATTRIBUTES
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(resource.NewSchemaless(name)))
		defer func() { // flush the spans still buffered, within 5s
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = tp.Shutdown(fctx)
		}()
		otel.SetTracerProvider(tp)
		otel.SetTextMapPropagator(propagation.TraceContext{})
		sqlTracer = otelpgx.NewTracer(otelpgx.WithDisableAcquireTracer())
		gw.Client = &http.Client{Transport: otelhttp.NewTransport(http.DefaultTransport)}
	}
	pool, err := openPool(c, sqlTracer)
	if err != nil {
		return err
	}
	defer pool.Close()
	half := time.Second / 2 // Redis is an accelerator: not pinged, not waited for
	rdb, err := inboxmq.RedisFromURL(c.RedisURL, &inboxmq.RedisOpts{DialTimeout: half, ReadTimeout: half, WriteTimeout: half})
	if err != nil {
		return fmt.Errorf("REDIS_URL: %w", err)
	}
	defer rdb.Close()
	w, err := inboxmq.NewWorker(&inboxmq.Config{
		URL: c.AMQPURL, DB: pool, Redis: rdb, Routes: routes(c, gw), Logger: logger,
		Addr: c.MetricsAddr, ConnectTimeout: c.ConnectTimeout, Exchanges: []string{c.Events},
		DropUnroutable: true, // an event nobody subscribed to is dropped, not retried forever
	})
	if err != nil {
		return err
	}
	logger.InfoContext(ctx, "payment-worker starting", slog.String("queue", c.Queue), slog.Bool("group_commit", c.GroupCommit == "on"))
	return w.Run(ctx)
}

// routes registers the payment handler: in claim mode with a gateway, else transactional.
func routes(c config, gw *Gateway) *inboxmq.Routes {
	u, _ := url.Parse(c.GatewayURL) // a rate limit is shared by the workers calling its host
	opts := &inboxmq.RouteOpts{
		Concurrency: c.Concurrency,
		Queue:       &inboxmq.QueueOpts{Type: c.QueueType, DeliveryLimit: c.DeliveryLimit},
		Reply:       true, // a request (reply_to) gets the stored result, every copy alike
		Lock:        ifOn(c.Lock == "on", &inboxmq.LockOpts{TTL: c.LockTTL, RetryDelay: time.Second}),
		Faults:      ifOn(c.FaultEvents == "on", &inboxmq.FaultOpts{Exchange: c.Events, RoutingKey: "payment.failed"}),
		GroupCommit: ifOn(c.GroupCommit == "on", &inbox.GroupCommit{}), // a group's claims and writes: one round trip
		Ordered:     ifOn(c.OrderedShards > 0, &inboxmq.OrderedOpts{Shards: c.OrderedShards}),
		Breaker: ifOn(c.Breaker == "on", &inboxmq.BreakerOpts{Downstream: "gateway", Window: c.BreakerWindow,
			Threshold: c.BreakerThreshold, MinCalls: c.BreakerMinCalls, CoolDown: c.BreakerCoolDown}),
		RateLimit: ifOn(c.RateLimit > 0, &inboxmq.RateLimitOpts{Downstream: "gateway:" + u.Host,
			Rate: c.RateLimit, ExpectedWorkers: c.GatewayWorkers}),
	}
	r := inboxmq.NewRoutes()
	if c.GatewayURL == "" {
		inboxmq.HandleBatch(r, c.Queue, recordPayment(c.Events), opts)
	} else {
		inboxmq.HandleClaim(r, c.Queue, chargeAndRecord(gw, c.Events), opts)
	}
	return r
}

// ifOn returns opts when on, else nil (the option stays off).
func ifOn[T any](on bool, opts *T) *T {
	if on {
		return opts
	}
	return nil
}

// openPool builds the pool on the writable primary among DATABASE_URL's hosts.
func openPool(c config, tracer pgx.QueryTracer) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(c.DatabaseURL)
	if err != nil {
		return nil, errors.New("DATABASE_URL: not a valid PostgreSQL URL") // the error may echo the password
	}
	if !strings.Contains(c.DatabaseURL, "pool_max_conns") {
		pcfg.MaxConns = int32(min(cmp.Or(c.Concurrency, 8)+8, 200)) //nolint:gosec // handlers + services, bounded
	}
	pcfg.ConnConfig.ConnectTimeout = cmp.Or(pcfg.ConnConfig.ConnectTimeout, c.ConnectTimeout)
	pcfg.ConnConfig.Tracer = tracer
	if err := inbox.ConfigurePool(pcfg); err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	return pgxpool.NewWithConfig(context.Background(), pcfg)
}

//go:embed *.sql
var sqlFS embed.FS // the example's tables

// migrate applies the framework's migrations, then the example's.
func migrate(ctx context.Context, c config) error {
	pool, err := openPool(c, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err = migrations.Up(ctx, pool); err == nil {
		err = migrations.UpFS(ctx, pool, sqlFS, "payment_worker_migrations")
	}
	if cc := pool.Config().ConnConfig; errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return &inboxmq.StartTimeoutError{Service: "PostgreSQL", Addr: fmt.Sprintf("%s:%d", cc.Host, cc.Port), Timeout: c.ConnectTimeout, Err: err}
	}
	return err
}
