package consumer

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/internal/amqpdial"
)

// DialOpts configure [Dial]. A nil *DialOpts means defaults.
type DialOpts struct {
	// Name is the connection_name client property, shown in the broker's
	// management UI and by rabbitmqctl list_connections. Defaults to none.
	Name string
	// TLS configures TLS for amqps:// URLs. Defaults to nil: an empty
	// tls.Config (the system roots, the URL's host name).
	TLS *tls.Config
	// Timeout bounds one node's dial (TCP, TLS and AMQP handshake), within
	// ctx's deadline. Defaults to 15s.
	Timeout time.Duration
	// Logger receives the line naming the node connected to, and one per
	// node that did not answer. Defaults to nil, which discards them.
	Logger *slog.Logger
}

// Dial connects to the broker the way the consumer does, for programs that
// publish or inspect queues beside a worker: rawURL is one amqp:// or
// amqps:// URL or the comma-separated URLs of a cluster's nodes (the value
// of Config.URL), and Dial returns a connection to the first node that
// answers, starting at a random one so that many programs spread over the
// cluster. The connection is not redialed when lost: dial again. The
// returned node is the host:port connected to. Credentials never appear in
// its errors.
func Dial(ctx context.Context, rawURL string, opts *DialOpts) (conn *amqp.Connection, node string, err error) {
	var o DialOpts
	if opts != nil {
		o = *opts
	}
	d, err := amqpdial.New(amqpdial.Config{URL: rawURL, TLS: o.TLS, Timeout: o.Timeout, Logger: o.Logger})
	if err != nil {
		return nil, "", fmt.Errorf("consumer: dial: %w", err)
	}
	conn, n, err := d.Dial(ctx, o.Name, amqpdial.RoleAdmin)
	if err != nil {
		return nil, "", fmt.Errorf("consumer: %w", err)
	}
	return conn, n.Addr, nil
}
