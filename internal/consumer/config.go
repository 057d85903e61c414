package consumer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqpdial"
)

// Config configures a [Consumer]. Only URL and Router are required; every
// other field has a default. A Config must not be changed after it is passed
// to [New].
type Config struct {
	// URL is the broker's amqp:// or amqps:// URL, or the URLs of a
	// cluster's nodes separated by commas
	// ("amqp://u:p@rabbit1:5672/,amqp://u:p@rabbit2:5672/"). Required. Each
	// connection goes to one node that answers: a process starts at a random
	// node and each new connection one node further, so workers spread over
	// the cluster, and a connection lost with its node is re-established on
	// another. Credentials never appear in logs or errors (see [RedactURL]).
	URL string

	// OnBrokerNode, when set, is called each time one of the consumer's
	// connections opens (connected true) or closes (false), with its role
	// ("consumer" for the consuming connection, "publisher" for the one
	// that publishes retry and dead-letter copies) and the node's
	// host:port. metrics.Metrics.BrokerNode fits it. Defaults to nil.
	OnBrokerNode func(role, node string, connected bool)

	// TLS configures TLS for amqps:// URLs. Defaults to nil: an amqps:// URL
	// then uses an empty tls.Config (the system roots, the URL's host name).
	TLS *tls.Config

	// Name identifies this worker process. It is sent as the AMQP
	// connection_name client property (operators see it in the management UI
	// and in rabbitmqctl list_connections), becomes Delivery.WorkerID and is
	// the prefix of consumer tags. Defaults to "<hostname>-<pid>".
	Name string

	// Router holds the handlers. Required.
	Router *Router

	// Logger receives connection-level events (connects, disconnects,
	// settlement failures). Defaults to nil, which discards them.
	Logger *slog.Logger

	// Observers receive every delivery transition and outcome and every
	// connection state change (logging, metrics and tracing plug in here).
	// Defaults to none.
	Observers []inboxtype.Observer

	// ReconnectInitialInterval is the first pause before reconnecting after
	// a lost connection; pauses then grow exponentially with jitter.
	// Defaults to 200ms.
	ReconnectInitialInterval time.Duration

	// ReconnectMaxInterval caps the pause between reconnect attempts.
	// Defaults to 30s.
	ReconnectMaxInterval time.Duration

	// SoftStopTimeout is how long Stop lets in-flight handlers run before it
	// cancels their contexts with cause [ErrStopped] (their deliveries are then
	// requeued without counting an attempt). Defaults to 10s; -1 cancels at
	// once when Stop is called.
	SoftStopTimeout time.Duration

	// HandlerTimeout is the bound on one run of a handler that the
	// router's middleware enforces (the Worker's Config.HandlerTimeout).
	// On a broker that takes per-consumer acknowledgement timeouts
	// (RabbitMQ 3.11.15 and later) each route's consume asks for one above
	// the longest a delivery may be held. Defaults to 0: none is asked for.
	HandlerTimeout time.Duration

	// ScheduleRetry, when set, schedules a retry copy outside the broker:
	// msg, the copy with its attempt number, is to be published to queue
	// once delay has passed. The Worker sets it to its outbox relay's
	// Schedule, so that a retry's wait does not depend on the broker's
	// dead-letter hop. An error (bounded by PublishTimeout) falls back to
	// the delay queues. Defaults to nil: retries wait in the delay queues.
	ScheduleRetry func(ctx context.Context, queue string, attempt int, delay time.Duration, msg *amqp.Publishing) error

	// PublishTimeout bounds the wait for the broker's publisher confirm of a
	// retry or dead-letter copy. An unconfirmed copy leaves the original
	// delivery requeued, never acked. Defaults to 10s.
	PublishTimeout time.Duration

	// Heartbeat is the AMQP heartbeat interval. Defaults to 10s.
	Heartbeat time.Duration

	// DialTimeout bounds establishing one connection to one node (TCP, TLS
	// and AMQP handshake); with several nodes, each node tried gets its own.
	// Defaults to 15s.
	DialTimeout time.Duration
}

func (c *Config) withDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Name == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "inboxmq"
		}
		out.Name = host + "-" + strconv.Itoa(os.Getpid())
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	if out.ReconnectInitialInterval == 0 {
		out.ReconnectInitialInterval = 200 * time.Millisecond
	}
	if out.ReconnectMaxInterval == 0 {
		out.ReconnectMaxInterval = 30 * time.Second
	}
	if out.SoftStopTimeout == 0 {
		out.SoftStopTimeout = 10 * time.Second
	}
	if out.PublishTimeout == 0 {
		out.PublishTimeout = 10 * time.Second
	}
	if out.Heartbeat == 0 {
		out.Heartbeat = 10 * time.Second
	}
	if out.DialTimeout == 0 {
		out.DialTimeout = 15 * time.Second
	}
	return out
}

func (c *Config) validate() error {
	if c.URL == "" {
		return errors.New("consumer: Config.URL is required")
	}
	if _, err := amqpdial.Parse(c.URL); err != nil {
		return fmt.Errorf("consumer: Config.URL: %w", err)
	}
	if c.Router == nil {
		return errors.New("consumer: Config.Router is required")
	}
	if len(c.Router.Routes()) == 0 {
		return errors.New("consumer: Config.Router has no handlers")
	}
	if strings.ContainsAny(c.Name, "\r\n\x00") || len(c.Name) > 200 {
		return fmt.Errorf("consumer: invalid Config.Name %q", c.Name)
	}
	if c.ReconnectInitialInterval < 0 || c.ReconnectMaxInterval < 0 {
		return errors.New("consumer: reconnect intervals must not be negative")
	}
	if c.ReconnectMaxInterval < c.ReconnectInitialInterval {
		return fmt.Errorf("consumer: ReconnectMaxInterval %s is below ReconnectInitialInterval %s", c.ReconnectMaxInterval, c.ReconnectInitialInterval)
	}
	if c.SoftStopTimeout < -1 {
		return fmt.Errorf("consumer: SoftStopTimeout %s is negative (use -1 to cancel at once)", c.SoftStopTimeout)
	}
	if c.PublishTimeout < 0 {
		return fmt.Errorf("consumer: PublishTimeout %s is negative", c.PublishTimeout)
	}
	if c.Heartbeat < 0 {
		return fmt.Errorf("consumer: Heartbeat %s is negative", c.Heartbeat)
	}
	if c.DialTimeout < 0 {
		return fmt.Errorf("consumer: DialTimeout %s is negative", c.DialTimeout)
	}
	for _, r := range c.Router.Routes() {
		if err := r.Opts.validateTopology(r.Queue); err != nil {
			return err
		}
	}
	return nil
}

// RedactURL returns rawURL with any password replaced by "xxxxx", so the
// URL can be logged or put into an error. A comma-separated list of
// amqp:// or amqps:// URLs (a cluster's nodes, as Config.URL takes) is
// redacted entry by entry. A string that does not parse as a URL is
// reduced to "<unparseable url>" because it may still contain a secret.
func RedactURL(rawURL string) string { return amqpdial.Redact(rawURL) }
