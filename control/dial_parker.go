package control

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/inboxtype"
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
	// DialTimeout bounds one dial (TCP, TLS and AMQP handshake) when the
	// context of Park has no earlier deadline. Defaults to 15s.
	DialTimeout time.Duration
}

// DialParker is a [Parker] that owns its broker connection: it dials on
// the first Park, and again when the connection is gone, so parking
// survives a broker restart without the caller managing a connection.
// middleware.Block accepts it. It is safe for concurrent use; Close closes
// its connection.
type DialParker struct {
	url  string
	opts DialParkerOpts

	mu     sync.Mutex
	conn   *amqp.Connection
	parker *Parker
	closed bool
}

// NewDialParker returns a parker publishing through its own connection to
// url (amqp:// or amqps://). It does not dial until the first Park.
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
	return &DialParker{url: url, opts: o}
}

// Park copies d to its parked queue like [Parker.Park], dialing first if
// the parker has no live connection. When the connection dies during the
// publish, it dials once more and tries again. ctx bounds the dial as well.
func (p *DialParker) Park(ctx context.Context, d *inboxtype.Delivery, b Block) error {
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
		return nil, errors.New("control: park: parker closed")
	}
	if p.conn != nil && !p.conn.IsClosed() {
		return p.parker, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("control: park: connect: %w", err)
	}
	timeout := p.opts.DialTimeout
	if deadline, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(deadline))
	}
	if timeout <= 0 {
		return nil, fmt.Errorf("control: park: connect: %w", context.DeadlineExceeded)
	}
	conn, err := amqp.DialConfig(p.url, amqp.Config{
		Properties:      amqp.Table{"connection_name": p.opts.ConnectionName},
		Heartbeat:       10 * time.Second,
		TLSClientConfig: p.opts.TLS,
		Dial:            amqp.DefaultDial(timeout),
	})
	if err != nil {
		// The error may echo the URL: never wrap it.
		return nil, errors.New("control: park: connect to " + consumer.RedactURL(p.url) + ": " + consumer.RedactURL(err.Error()))
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
		return fmt.Errorf("control: close parker: %w", err)
	}
	return nil
}
