package controlrun

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqpdial"
)

// DialParkerOpts configure a [DialParker]. A nil *DialParkerOpts means
// defaults.
type DialParkerOpts struct {
	// ConnectionName is the connection_name client property of the
	// parker's connection, shown in the broker's management UI. Defaults
	// to "inboxmq-parker".
	ConnectionName string
	// TLS configures TLS for an amqps:// URL. Defaults to nil: an empty
	// tls.Config (the system roots, the URL's host name).
	TLS *tls.Config
	// DialTimeout bounds one node's dial (TCP, TLS and AMQP handshake)
	// when the context of Park has no earlier deadline. Defaults to 15s.
	DialTimeout time.Duration
	// OnBrokerNode, when set, is called when the parker's connection opens
	// (connected true) or closes (false), with the role "parker" and the
	// node's host:port. metrics.Metrics.BrokerNode fits it. Defaults to nil.
	OnBrokerNode func(role, node string, connected bool)
	// Logger receives a line for every connect, failover and lost
	// connection, with the node. Defaults to nil, which discards them.
	Logger *slog.Logger
}

// DialParker is a [Parker] that owns its broker connection: it dials on
// the first Park, and again when the connection is gone, so parking
// survives a broker restart without the caller managing a connection.
// Given the URLs of a cluster's nodes, it connects to one that answers
// and, once that connection is gone, to another.
// middleware.Block accepts it. It is safe for concurrent use; Close closes
// its connection.
type DialParker struct {
	opts   DialParkerOpts
	dialer *amqpdial.Dialer
	urlErr error // a bad url: every Park fails with it

	mu     sync.Mutex
	conn   *amqp.Connection
	parker *Parker
	closed bool
}

// NewDialParker returns a parker publishing through its own connection to
// url: an amqp:// or amqps:// URL, or a comma-separated list of them (a
// cluster's nodes). It does not dial until the first Park; a url that does
// not parse makes every Park fail with an error saying why.
func NewDialParker(url string, opts *DialParkerOpts) *DialParker {
	var o DialParkerOpts
	if opts != nil {
		o = *opts
	}
	if o.ConnectionName == "" {
		o.ConnectionName = "inboxmq-parker"
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 15 * time.Second
	}
	p := &DialParker{opts: o}
	p.dialer, p.urlErr = amqpdial.New(amqpdial.Config{
		URL: url, TLS: o.TLS, Timeout: o.DialTimeout, Logger: o.Logger, OnNode: o.OnBrokerNode,
	})
	return p
}

// Park copies d to its parked queue like [Parker.Park], dialing first if
// the parker has no live connection. When the connection dies during the
// publish, it dials once more and tries again. ctx bounds the dial as well.
func (p *DialParker) Park(ctx context.Context, d *inboxtype.Delivery, b control.Block) error {
	pk, err := p.current(ctx)
	if err != nil {
		return err
	}
	err = pk.Park(ctx, d, b)
	if err == nil || !p.lost() {
		return err
	}
	if pk, err = p.current(ctx); err != nil {
		return err
	}
	return pk.Park(ctx, d, b)
}

func (p *DialParker) lost() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn == nil || p.conn.IsClosed()
}

// current returns the parker on a live connection, dialing if needed.
func (p *DialParker) current(ctx context.Context) (*Parker, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("controlrun: park: parker closed")
	}
	if p.urlErr != nil {
		return nil, fmt.Errorf("controlrun: park: %w", p.urlErr)
	}
	if p.conn != nil && !p.conn.IsClosed() {
		return p.parker, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("controlrun: park: connect: %w", err)
	}
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= 0 {
		return nil, fmt.Errorf("controlrun: park: connect: %w", context.DeadlineExceeded)
	}
	conn, _, err := p.dialer.Dial(ctx, p.opts.ConnectionName, amqpdial.RoleParker)
	if err != nil {
		return nil, fmt.Errorf("controlrun: park: %w", err)
	}
	p.conn, p.parker = conn, NewParker(conn)
	return p.parker, nil
}

// Close closes the parker's channel and connection. A later Park fails.
// It is idempotent and safe without a Park.
func (p *DialParker) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.conn == nil {
		return nil
	}
	_ = p.parker.Close()
	err := p.conn.Close()
	p.conn, p.parker = nil, nil
	if err != nil && !errors.Is(err, amqp.ErrClosed) {
		return fmt.Errorf("controlrun: close parker: %w", err)
	}
	return nil
}
