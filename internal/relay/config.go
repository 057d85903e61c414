package relay

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmq/inboxmq/internal/amqpdial"
)

// Config configures a [Relay]. Only URL is required; every other field
// has a default.
type Config struct {
	// URL is the AMQP URL of the broker (amqp:// or amqps://), or the URLs
	// of a cluster's nodes separated by commas. Required. Each lane's
	// connection goes to one node that answers, starting one node further
	// than the previous connection, and a lane that loses its connection
	// reconnects to a node that answers. It is never logged with its
	// password.
	URL string
	// OnBrokerNode, when set, is called when a lane's connection opens
	// (connected true) or closes (false), with the role "relay" and the
	// node's host:port. metrics.Metrics.BrokerNode fits it. Defaults to nil.
	OnBrokerNode func(role, node string, connected bool)
	// ConnectionName is the connection_name client property, shown in the
	// broker's management UI and rabbitmqctl, suffixed " #<lane>" per
	// connection (see Concurrency). Defaults to
	// "inboxmq-outbox-relay".
	ConnectionName string

	// BatchSize is how many rows one claim takes (and publishes in one
	// pipelined burst before waiting for the confirms). Defaults to 100.
	BatchSize int
	// Concurrency is how many batches one relay has in flight at once, each
	// with its own transaction, AMQP connection and confirm channel, so one
	// batch is published while another commits. Ordering keys hold
	// across them as they do across relays. Each lane holds one connection
	// of the pool while its batch is in flight. Defaults to 2.
	Concurrency int
	// PollInterval is the fallback wake-up when no NOTIFY arrives (and the
	// time after which rows that backed off are picked up). Defaults to 1s.
	PollInterval time.Duration
	// GatherDelay is how long a lane waits before its next claim when rows
	// kept arriving while its last batch was in flight (a wake-up is
	// already pending when the batch ends), so that the next claim takes
	// more rows for the same PostgreSQL round trips. A lane that was idle
	// claims as soon as it is woken, without this wait, and a full batch
	// is followed at once by the next. It adds at most GatherDelay to the
	// latency of the rows that wait for it, and only while rows keep
	// arriving; a lone event after a quiet spell goes out at once. At a
	// steady load it bounds how often a lane runs a batch (a claim, the
	// publishes, the mark) and so the relay's cost per row: a smaller
	// value trades CPU on the worker and the database for latency.
	// Defaults to 10ms; -1 disables it.
	GatherDelay time.Duration
	// AllowUnroutable publishes without the mandatory flag, so the broker
	// silently drops a message that no queue is bound for and the row is
	// marked sent. Defaults to false: mandatory publishes, and a returned
	// (unroutable) message stays pending and is retried with backoff.
	AllowUnroutable bool

	// RetryMinDelay is the delay before a row whose publish was nacked or
	// returned is tried again; it doubles per attempt. Rows are retried
	// forever (watch outbox_oldest_pending_age_seconds).
	// Defaults to 1s.
	RetryMinDelay time.Duration
	// RetryMaxDelay caps the per-row delay. Defaults to 5m.
	RetryMaxDelay time.Duration
	// ReconnectMinDelay is the first delay of the exponential backoff used
	// to reconnect to the broker and to PostgreSQL's LISTEN connection.
	// Defaults to 100ms.
	ReconnectMinDelay time.Duration
	// ReconnectMaxDelay caps the reconnect backoff. Defaults to 30s.
	ReconnectMaxDelay time.Duration

	// Retention is how long sent rows are kept before the relay deletes
	// them. Keep it longer than the receivers' inbox needs to recognise a
	// re-enqueue of the same id as a no-op. Defaults to 24h; -1 disables
	// deletion.
	Retention time.Duration
	// RetentionBatchSize is how many rows one DELETE removes, so retention
	// never holds long locks. Defaults to 1000.
	RetentionBatchSize int
	// StatsInterval is how often the relay refreshes the pending-rows
	// gauges (one count query). Defaults to 5s.
	StatsInterval time.Duration

	// Logger receives one debug line per batch, and warnings for failures
	// and reconnects. Nil means no logging.
	Logger *slog.Logger
	// Registerer registers the relay's metrics. Nil means
	// prometheus.DefaultRegisterer. Relays sharing a Registerer share the
	// collectors.
	Registerer prometheus.Registerer
	// TracerProvider makes one producer span per published row, "publish
	// <exchange>" (the routing key on the default exchange), a child of
	// the trace context Enqueue stored with the row; the published message
	// carries the span's own context, so its consumer's span is the
	// publish span's child. Nil means otel.GetTracerProvider(), a no-op
	// until the program installs an SDK.
	TracerProvider trace.TracerProvider
}

// The relay's fixed timings.
const (
	// publishTimeout bounds one batch: claim, publish, confirms and mark.
	// A batch in flight when the relay stops still gets this long.
	publishTimeout = 30 * time.Second
	// retentionInterval is how often the relay deletes old sent rows.
	retentionInterval = time.Minute
)

func (c *Config) withDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if out.ConnectionName == "" {
		out.ConnectionName = "inboxmq-outbox-relay"
	}
	if out.BatchSize == 0 {
		out.BatchSize = 100
	}
	if out.Concurrency == 0 {
		out.Concurrency = 2
	}
	def(&out.PollInterval, time.Second)
	def(&out.GatherDelay, 10*time.Millisecond)
	def(&out.RetryMinDelay, time.Second)
	def(&out.RetryMaxDelay, 5*time.Minute)
	def(&out.ReconnectMinDelay, 100*time.Millisecond)
	def(&out.ReconnectMaxDelay, 30*time.Second)
	def(&out.Retention, 24*time.Hour)
	if out.RetentionBatchSize == 0 {
		out.RetentionBatchSize = 1000
	}
	def(&out.StatsInterval, 5*time.Second)
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	if out.Registerer == nil {
		out.Registerer = prometheus.DefaultRegisterer
	}
	if out.TracerProvider == nil {
		out.TracerProvider = otel.GetTracerProvider()
	}
	return out
}

func (c *Config) validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, errors.New("relay: Config.URL is required"))
	} else if _, err := amqpdial.Parse(c.URL); err != nil {
		errs = append(errs, fmt.Errorf("relay: Config.URL: %w", err))
	}
	if c.BatchSize < 1 {
		errs = append(errs, fmt.Errorf("relay: Config.BatchSize must be positive, got %d", c.BatchSize))
	}
	if c.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("relay: Config.Concurrency must be positive, got %d", c.Concurrency))
	}
	if c.RetentionBatchSize < 1 {
		errs = append(errs, fmt.Errorf("relay: Config.RetentionBatchSize must be positive, got %d", c.RetentionBatchSize))
	}
	if c.Retention < 0 && c.Retention != -1 {
		errs = append(errs, fmt.Errorf("relay: Config.Retention must be positive or -1, got %s", c.Retention))
	}
	if c.GatherDelay < 0 && c.GatherDelay != -1 {
		errs = append(errs, fmt.Errorf("relay: Config.GatherDelay must be positive or -1, got %s", c.GatherDelay))
	}
	for name, d := range map[string]time.Duration{
		"PollInterval": c.PollInterval, "StatsInterval": c.StatsInterval,
		"RetryMinDelay": c.RetryMinDelay, "RetryMaxDelay": c.RetryMaxDelay,
		"ReconnectMinDelay": c.ReconnectMinDelay, "ReconnectMaxDelay": c.ReconnectMaxDelay,
	} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("relay: Config.%s must be positive, got %s", name, d))
		}
	}
	if c.RetryMaxDelay < c.RetryMinDelay {
		errs = append(errs, errors.New("relay: Config.RetryMaxDelay is below RetryMinDelay"))
	}
	if c.ReconnectMaxDelay < c.ReconnectMinDelay {
		errs = append(errs, errors.New("relay: Config.ReconnectMaxDelay is below ReconnectMinDelay"))
	}
	return errors.Join(errs...)
}

// redactURL returns u (one URL or a list) with its passwords replaced, for
// logs and errors. An unparsable URL is not echoed at all.
func redactURL(u string) string { return amqpdial.Redact(u) }
