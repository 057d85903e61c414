package producer

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmq/inboxmq/internal/amqpdial"
)

// Config configures a [Producer]. Only URL is required.
type Config struct {
	// URL is the broker's amqp:// or amqps:// URL, or a comma-separated
	// list of the URLs of a cluster's nodes: a (re)connect tries them in
	// turn, starting after the node of the last connection. Required.
	// Credentials in it never appear in logs or errors.
	URL string
	// ConnectionName is the connection_name client property, shown in the
	// broker's management UI and rabbitmqctl. Defaults to
	// "inboxmq-producer".
	ConnectionName string
	// TLS configures amqps:// connections. Defaults to nil: the system's
	// roots and the URL's host name.
	TLS *tls.Config
	// DialTimeout bounds one dial, with its TLS and AMQP handshakes.
	// Defaults to 10s.
	DialTimeout time.Duration
	// Heartbeat is the AMQP heartbeat interval, which detects a dead
	// connection. Defaults to 10s.
	Heartbeat time.Duration

	// PublishTimeout bounds one attempt of a publish: waiting for a free
	// channel, the publish and its confirm. An attempt that times out is
	// retried. Defaults to 30s.
	PublishTimeout time.Duration
	// RetryTimeout bounds the retries of one publish after a lost
	// connection or channel, a timed-out attempt or a nack: past it the
	// publish returns the last error. ctx bounds it too. Defaults to 1m;
	// -1 retries until ctx ends.
	RetryTimeout time.Duration
	// RetryMinDelay is the first delay of the exponential backoff between
	// attempts (jittered, growing by 1.5 per attempt). Defaults to 100ms.
	RetryMinDelay time.Duration
	// RetryMaxDelay caps the backoff. Defaults to 5s.
	RetryMaxDelay time.Duration
	// MaxChannels bounds the confirm channels open at once, and so the
	// publishes in flight: more wait for a channel (bounded by their ctx
	// and PublishTimeout). Defaults to 32.
	MaxChannels int

	// Logger receives a warning per retried attempt and an info line per
	// connection. Defaults to nil: no logging.
	Logger *slog.Logger
	// TracerProvider makes one producer span per publish, "publish
	// <exchange>" (the routing key on the default exchange), a child of
	// the span in the publish's ctx, covering every attempt; the message
	// carries the span's context, so its consumer's span is the publish
	// span's child. Defaults to otel.GetTracerProvider(), a no-op until the
	// program installs an SDK (the context of a span in ctx is still
	// carried).
	TracerProvider trace.TracerProvider
}

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
		out.ConnectionName = "inboxmq-producer"
	}
	def(&out.DialTimeout, 10*time.Second)
	def(&out.Heartbeat, 10*time.Second)
	def(&out.PublishTimeout, 30*time.Second)
	def(&out.RetryTimeout, time.Minute)
	def(&out.RetryMinDelay, 100*time.Millisecond)
	def(&out.RetryMaxDelay, 5*time.Second)
	if out.MaxChannels == 0 {
		out.MaxChannels = 32
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	if out.TracerProvider == nil {
		out.TracerProvider = otel.GetTracerProvider()
	}
	return out
}

func (c *Config) validate() error {
	var errs []error
	if strings.TrimSpace(c.URL) == "" {
		errs = append(errs, errors.New("producer: Config.URL is required"))
	} else if _, err := amqpdial.Parse(c.URL); err != nil {
		errs = append(errs, fmt.Errorf("producer: Config.URL: %w", err))
	}
	for name, d := range map[string]time.Duration{
		"DialTimeout": c.DialTimeout, "Heartbeat": c.Heartbeat, "PublishTimeout": c.PublishTimeout,
		"RetryMinDelay": c.RetryMinDelay, "RetryMaxDelay": c.RetryMaxDelay,
	} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("producer: Config.%s must be positive, got %s", name, d))
		}
	}
	if c.RetryTimeout < 0 && c.RetryTimeout != -1 {
		errs = append(errs, fmt.Errorf("producer: Config.RetryTimeout must be positive or -1, got %s", c.RetryTimeout))
	}
	if c.RetryMaxDelay < c.RetryMinDelay {
		errs = append(errs, errors.New("producer: Config.RetryMaxDelay is below RetryMinDelay"))
	}
	if c.MaxChannels < 1 {
		errs = append(errs, fmt.Errorf("producer: Config.MaxChannels must be positive, got %d", c.MaxChannels))
	}
	return errors.Join(errs...)
}
