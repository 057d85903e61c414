package producer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmq/inboxmq/internal/amqpdial"
	"github.com/inboxmq/inboxmq/internal/confirm"
)

// Producer publishes messages with publisher confirms on one broker
// connection, opened at the first publish and opened again after it is
// lost. Build it with [New]; the zero value is not usable. A Producer is
// safe for concurrent use: each publish in flight has a confirm channel of
// its own (up to Config.MaxChannels).
type Producer struct {
	cfg    Config
	dialer *amqpdial.Dialer
	log    *slog.Logger
	tracer trace.Tracer

	cur  atomic.Pointer[session] // the current connection, nil before the first
	gate chan struct{}           // held while the connection is replaced or closed

	closeOnce sync.Once
	closed    chan struct{}

	// dialed, when set (by tests), gets every network connection dialed.
	dialed atomic.Pointer[func(net.Conn)]
}

// session is one connection with its pool of confirm channels.
type session struct {
	conn *amqp.Connection
	pool *confirm.Pool
}

func (s *session) close() {
	_ = s.conn.Close()
	s.pool.Close()
}

// New validates cfg and returns a producer. It does no I/O: the first
// publish connects. A nil cfg is invalid (URL is required).
func New(cfg *Config) (*Producer, error) {
	if cfg == nil {
		return nil, errors.New("producer: nil Config (Config.URL is required)")
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	p := &Producer{
		cfg:    c,
		log:    c.Logger.With(slog.String("component", "producer"), slog.String("connection_name", c.ConnectionName)),
		tracer: c.TracerProvider.Tracer("github.com/inboxmq/inboxmq/producer"),
		gate:   make(chan struct{}, 1),
		closed: make(chan struct{}),
	}
	d, err := amqpdial.New(amqpdial.Config{
		URL:       c.URL,
		TLS:       c.TLS,
		Heartbeat: c.Heartbeat,
		Timeout:   c.DialTimeout,
		Logger:    c.Logger,
		OnConn: func(nc net.Conn) {
			if f := p.dialed.Load(); f != nil {
				(*f)(nc)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("producer: Config.URL: %w", err)
	}
	p.dialer = d
	return p, nil
}

// Close closes the connection. Publishes in flight end with [ErrClosed]
// (whether the broker took their message is unknown) and later ones fail
// with it. Close is idempotent.
func (p *Producer) Close() error {
	p.closeOnce.Do(func() {
		close(p.closed)
		p.gate <- struct{}{}
		defer func() { <-p.gate }()
		if s := p.cur.Swap(nil); s != nil {
			s.close()
		}
	})
	return nil
}

func (p *Producer) isClosed() bool {
	select {
	case <-p.closed:
		return true
	default:
		return false
	}
}

// session returns the open connection, or dials one (a single dial for
// every publish waiting on it), bounded by ctx.
func (p *Producer) session(ctx context.Context) (*session, error) {
	if s := p.cur.Load(); s != nil && !s.conn.IsClosed() {
		return s, nil
	}
	select {
	case p.gate <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.closed:
		return nil, ErrClosed
	}
	defer func() { <-p.gate }()
	if p.isClosed() {
		return nil, ErrClosed
	}
	if s := p.cur.Load(); s != nil {
		if !s.conn.IsClosed() {
			return s, nil // another publish has just reconnected
		}
		p.cur.Store(nil)
		s.close()
	}
	conn, node, err := p.dial(ctx)
	if err != nil {
		return nil, err
	}
	pool, err := confirm.NewPool(conn, p.cfg.MaxChannels, p.cfg.MaxChannels)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("producer: %w", err)
	}
	s := &session{conn: conn, pool: pool}
	p.cur.Store(s)
	p.log.LogAttrs(ctx, slog.LevelInfo, "producer connected", slog.String("url", node))
	return s, nil
}

// drop closes s if it is still the current connection, so that the next
// publish dials again.
func (p *Producer) drop(s *session) {
	if p.cur.CompareAndSwap(s, nil) {
		s.close()
	}
}

// dial connects to a node of Config.URL that answers (the cluster-aware
// dialer every broker connection of the project uses), bounded by ctx and
// DialTimeout per node, and returns the node's redacted URL.
func (p *Producer) dial(ctx context.Context) (*amqp.Connection, string, error) {
	conn, node, err := p.dialer.Dial(ctx, p.cfg.ConnectionName, amqpdial.RoleProducer)
	if err != nil {
		return nil, "", &transientError{fmt.Errorf("producer: %w", err)}
	}
	return conn, node.Redacted(), nil
}

// transientError marks a failure that a later attempt may not meet: a lost
// connection or channel, a timeout, a nack.
type transientError struct{ err error }

func (e *transientError) Error() string { return e.err.Error() }
func (e *transientError) Unwrap() error { return e.err }

// send publishes msg with retries: see [Producer.Send].
func (p *Producer) send(ctx context.Context, exchange, routingKey string, mandatory bool, msg *amqp.Publishing) error {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = p.cfg.RetryMinDelay
	bo.MaxInterval = p.cfg.RetryMaxDelay
	bo.MaxElapsedTime = 0 // RetryTimeout is checked below, before each wait
	bo.Reset()
	start := time.Now()
	for attempt := 1; ; attempt++ {
		err := p.attempt(ctx, exchange, routingKey, mandatory, msg)
		if err == nil {
			return nil
		}
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("producer: publish to exchange %q, routing key %q: %w", exchange, routingKey, joinCtx(err, cerr))
		}
		var te *transientError
		if !errors.As(err, &te) {
			return err
		}
		wait := bo.NextBackOff()
		if p.cfg.RetryTimeout > 0 && time.Since(start)+wait > p.cfg.RetryTimeout {
			return fmt.Errorf("producer: publish to exchange %q, routing key %q: gave up after %d attempts in %s: %w",
				exchange, routingKey, attempt, time.Since(start).Round(time.Millisecond), err)
		}
		p.log.LogAttrs(ctx, slog.LevelWarn, "producer: publish failed; retrying",
			slog.String("exchange", exchange), slog.String("routing_key", routingKey),
			slog.String("message_id", msg.MessageId), slog.Int("attempt", attempt),
			slog.Any("error", err), slog.Duration("retry_in", wait))
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("producer: publish to exchange %q, routing key %q: %w", exchange, routingKey, joinCtx(err, ctx.Err()))
		case <-p.closed:
			t.Stop()
			return ErrClosed
		}
	}
}

// joinCtx joins err and ctx's error, unless err already is ctx's.
func joinCtx(err, ctxErr error) error {
	if errors.Is(err, ctxErr) {
		return err
	}
	return errors.Join(err, ctxErr)
}

// attempt publishes msg once on the current connection and classifies the
// result: nil, a *transientError (retry), or a final error.
func (p *Producer) attempt(ctx context.Context, exchange, routingKey string, mandatory bool, msg *amqp.Publishing) error {
	s, err := p.session(ctx)
	if err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(ctx, p.cfg.PublishTimeout)
	err = s.pool.Publish(actx, exchange, routingKey, mandatory, *msg)
	cancel()
	if err == nil {
		return nil
	}
	var (
		ret      *confirm.ReturnedError
		closed   *confirm.ClosedError
		tooLarge *confirm.TooLargeError
	)
	switch {
	case errors.As(err, &tooLarge):
		return &InvalidError{Err: tooLarge}
	case errors.As(err, &ret):
		return &UnroutableError{Exchange: exchange, RoutingKey: routingKey, ReplyCode: ret.Return.ReplyCode, ReplyText: ret.Return.ReplyText}
	case p.isClosed():
		return ErrClosed
	case ctx.Err() != nil:
		return ctx.Err()
	case s.conn.IsClosed():
		p.drop(s)
		return &transientError{fmt.Errorf("producer: connection lost: %w", err)}
	case errors.As(err, &closed) && closed.Reason != nil && closed.Reason.Recover:
		// The broker closed the channel over this publish (a missing
		// exchange, a refused permission): the next attempt would meet it
		// again.
		return fmt.Errorf("producer: publish to exchange %q, routing key %q: %w", exchange, routingKey, closed.Reason)
	case errors.Is(err, confirm.ErrNacked):
		return &transientError{ErrNacked}
	case errors.Is(err, context.DeadlineExceeded):
		return &transientError{fmt.Errorf("producer: no confirm within %s: %w", p.cfg.PublishTimeout, err)}
	default:
		return &transientError{fmt.Errorf("producer: %w", err)}
	}
}
