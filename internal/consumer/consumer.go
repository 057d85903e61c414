package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqpdial"
	"github.com/inboxmq/inboxmq/internal/startstop"
)

// Consumer consumes the queues of a [Router] and settles every delivery
// according to its handler's result: ack after success, publish-with-confirm
// to a delay tier or the dead-letter queue and then ack, or requeue on
// shutdown. It owns one connection at a time, re-established with backoff
// when it is lost. Build it with [New]; the zero value is not usable.
type Consumer struct {
	cfg     Config
	log     *slog.Logger
	dialer  *amqpdial.Dialer
	routes  []*route
	byQueue map[string]*route
	hooks   atomic.Pointer[testHooks]
	acks    ackStats
	// settleFailures outlives sessions: a delivery whose settlement failed
	// waits longer each time it comes back, on any session.
	settleFailures settleFailures
	// progress feeds the liveness watchdog (Progress).
	progress progress

	// svc is the consumer's lifecycle, the one every service of a worker
	// runs on: Start connects (its init), the run supervises the
	// connection until Stop, then stops gracefully.
	svc startstop.Service

	mu       sync.Mutex
	state    inboxtype.ConnState
	stopping bool     // Stop was called: the consumer does not start again
	sess     *session // the first session, from Start's connect to the run

	stopCh      chan struct{} // closed when the run begins to stop: stop consuming
	stopOnce    sync.Once
	stopped     chan struct{} // closed once fully stopped
	stoppedOnce sync.Once
	workersQuit chan struct{} // closed once no loop dispatches any more
	workers     sync.WaitGroup
	// filers counts the dead queues' loops (deadLoop), which file on their
	// own goroutine and run OnDeadLetter there. A failed session's close
	// does not wait for them past its bound (waitSettled): a filing stuck
	// in its hook must not hold every route's reconnection. Stop does.
	filers sync.WaitGroup

	baseCtx    context.Context //nolint:containedctx // the service's own run context (river style)
	cancelBase context.CancelCauseFunc
}

// New validates cfg and returns a consumer ready to [Consumer.Start]. It does
// not connect. A nil cfg is invalid (URL and Router are required).
func New(cfg *Config) (*Consumer, error) {
	if cfg == nil {
		return nil, errors.New("consumer: nil Config")
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	log := c.Logger.With(slog.String("worker", c.Name))
	dialer, err := amqpdial.New(amqpdial.Config{
		URL: c.URL, TLS: c.TLS, Heartbeat: c.Heartbeat, Timeout: c.DialTimeout, Logger: log, OnNode: c.OnBrokerNode,
	})
	if err != nil {
		return nil, fmt.Errorf("consumer: Config.URL: %w", err)
	}
	cons := &Consumer{
		cfg:         c,
		log:         log,
		dialer:      dialer,
		byQueue:     make(map[string]*route),
		state:       inboxtype.ConnDisconnected,
		stopCh:      make(chan struct{}),
		stopped:     make(chan struct{}),
		workersQuit: make(chan struct{}),
	}
	for _, r := range c.Router.Routes() {
		rt := newRoute(r)
		cons.routes = append(cons.routes, rt)
		cons.byQueue[r.Queue] = rt
	}
	return cons, nil
}

// Start connects, declares every route's topology and starts consuming. It
// returns once every queue that is not paused is being consumed, or with the
// error of the first connection attempt (the URL in it is redacted). ctx
// bounds the first dial (Config.DialTimeout bounds the handshake); its
// values, but not its cancellation, are passed on to handlers. Later connection losses are handled by the consumer
// itself: it reconnects with backoff and resumes. Stop it with
// [Consumer.Stop]. Start may be called again after it failed, but not after
// it succeeded or after Stop.
func (c *Consumer) Start(ctx context.Context) error {
	c.mu.Lock()
	stopping := c.stopping
	c.mu.Unlock()
	if stopping {
		return fmt.Errorf("consumer: Start after Stop: %w", ErrStopped)
	}
	if err := c.svc.Start(ctx, c.begin, c.run); err != nil {
		if errors.Is(err, startstop.ErrAlreadyStarted) {
			return errors.New("consumer: already started")
		}
		return err
	}
	return nil
}

// begin is Start's part: it connects, declares the topology, starts
// consuming and the worker pools.
func (c *Consumer) begin(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("consumer: start: %w", err)
	}
	base, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	c.mu.Lock()
	c.baseCtx, c.cancelBase = base, cancel
	c.mu.Unlock()
	sess, err := c.connect(ctx)
	if err != nil {
		cancel(err)
		return err
	}
	c.mu.Lock()
	c.sess = sess
	c.mu.Unlock()
	for _, r := range c.routes {
		for range r.Opts.Queue.Concurrency {
			c.workers.Add(1)
			go c.work(r)
		}
	}
	c.setState(inboxtype.ConnConnected, nil)
	return nil
}

// run supervises the connection until its context ends (Stop), then
// stops gracefully: no new deliveries; in-flight ones get
// Config.SoftStopTimeout to finish before their contexts are cancelled.
func (c *Consumer) run(ctx context.Context) error {
	c.mu.Lock()
	sess := c.sess
	c.sess = nil
	c.mu.Unlock()
	go func() {
		<-ctx.Done()
		c.stopOnce.Do(func() { close(c.stopCh) })
		if c.cfg.SoftStopTimeout < 0 {
			c.cancelBase(ErrStopped)
			return
		}
		t := time.NewTimer(c.cfg.SoftStopTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			c.log.LogAttrs(context.Background(), slog.LevelWarn, "consumer: soft stop timeout reached; cancelling handlers",
				slog.Duration("soft_stop_timeout", c.cfg.SoftStopTimeout))
			c.cancelBase(ErrStopped)
		case <-c.stopped:
		}
	}()
	c.supervise(sess)
	return nil
}

func (c *Consumer) markStopped() {
	c.stoppedOnce.Do(func() {
		c.setState(inboxtype.ConnStopped, nil)
		close(c.stopped)
	})
}

// Stop stops consuming (basic.cancel on every queue) and waits for in-flight
// handlers to finish and settle. Deliveries that were prefetched but not
// started are requeued. After Config.SoftStopTimeout, or when ctx is done,
// handler contexts are cancelled with cause [ErrStopped]: interrupted
// deliveries are requeued without counting an attempt. Stop then closes the
// connection; whatever was not settled is redelivered by the broker. It
// returns nil once everything stopped, or an error joined with ctx's if
// ctx ended first (the consumer then finishes stopping in the background;
// see [Consumer.Stopped]). Stop is idempotent and safe to call without
// Start; a consumer does not start again after it.
func (c *Consumer) Stop(ctx context.Context) error {
	c.mu.Lock()
	c.stopping = true
	cancel := c.cancelBase
	c.mu.Unlock()
	if cancel != nil {
		// The deadline of Stop cuts the soft stop short.
		halt := context.AfterFunc(ctx, func() { cancel(ErrStopped) })
		defer halt()
	}
	err := c.svc.Stop(ctx)
	select {
	case <-c.svc.Stopped():
		c.markStopped() // never started, or a Start that failed
	default:
	}
	if err != nil {
		return fmt.Errorf("consumer: %w", errors.Join(ErrStopped, err))
	}
	return nil
}

// Stopped returns a channel closed once the consumer has fully stopped
// (after Stop: no handler runs and the connection is closed).
func (c *Consumer) Stopped() <-chan struct{} { return c.stopped }

// State reports the connection state (ConnDisconnected before Start).
func (c *Consumer) State() inboxtype.ConnState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state
}

// Ready reports whether the consumer is connected, has declared its topology
// and is consuming (paused queues count as ready): the check for a /readyz
// endpoint.
func (c *Consumer) Ready() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state == inboxtype.ConnConnected && !c.stopping
}

func (c *Consumer) setState(s inboxtype.ConnState, err error) {
	c.mu.Lock()
	changed := c.state != s
	c.state = s
	c.mu.Unlock()
	if !changed {
		return
	}
	if err != nil {
		c.log.LogAttrs(context.Background(), slog.LevelWarn, "consumer: connection state",
			slog.String("state", string(s)), slog.Any("error", err))
	} else {
		c.log.LogAttrs(context.Background(), slog.LevelInfo, "consumer: connection state", slog.String("state", string(s)))
	}
	for _, o := range c.cfg.Observers {
		o.OnConnState(s, err)
	}
}

// supervise owns the connection: it waits for the session to fail or for
// Stop, reconnects with backoff, and finally shuts down.
func (c *Consumer) supervise(sess *session) {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = c.cfg.ReconnectInitialInterval
	bo.MaxInterval = c.cfg.ReconnectMaxInterval
	bo.MaxElapsedTime = 0
	bo.Reset()
	for {
		select {
		case <-c.stopCh:
			c.shutdown(sess)
			return
		case <-sess.failed:
		}
		c.setState(inboxtype.ConnDisconnected, sess.failErr)
		sess.close()
		sess = nil
		for sess == nil {
			wait := time.NewTimer(bo.NextBackOff())
			select {
			case <-c.stopCh:
				wait.Stop()
				c.shutdown(nil)
				return
			case <-wait.C:
			}
			s, err := c.connect(c.baseCtx)
			if err != nil {
				c.log.LogAttrs(c.baseCtx, slog.LevelWarn, "consumer: reconnect failed", slog.Any("error", err))
				continue
			}
			sess = s
		}
		bo.Reset()
		c.setState(inboxtype.ConnConnected, nil)
	}
}

// shutdown ends a graceful stop: consumers are cancelled, in-flight
// handlers finish (or are cancelled by Stop), then the connection closes.
func (c *Consumer) shutdown(sess *session) {
	if sess != nil {
		close(sess.stopConsuming)
		sess.loops.Wait()
	}
	c.filers.Wait() // this session's, and a failed one's still filing
	close(c.workersQuit)
	c.workers.Wait()
	if sess != nil {
		sess.close()
	}
	c.cancelBase(ErrStopped)
	c.markStopped()
}

// session is one connection with its channels and delivery loops.
type session struct {
	c    *Consumer
	conn *amqp.Connection
	// pubConn carries the retry and dead-letter copies. It is a connection of
	// its own: under a memory or disk alarm RabbitMQ blocks connections that
	// publish, and acks and nacks on a blocked consumer connection would
	// stall with them (RabbitMQ's advice: publish and consume on separate
	// connections).
	pubConn *amqp.Connection
	pub     *publisher
	// timeouts says that the broker takes per-consumer acknowledgement
	// timeouts (consumer_timeout.go).
	timeouts      bool
	loops         sync.WaitGroup
	stopConsuming chan struct{}

	failOnce sync.Once
	failed   chan struct{}
	failErr  error

	// settling counts the settlements under way (beginSettle). One that
	// began before the session failed finishes on its own channel when
	// that channel is still open: close waits for it, up to
	// Config.PublishTimeout, before closing the connection. Otherwise the
	// failure of one channel would cut off a healthy channel's settlement
	// between its copy's confirm and its ack, and the broker's redelivery
	// would file a second copy and run OnDeadLetter again. One still under
	// way after that is cut off: the broker redelivers it, and the next
	// session files it again.
	gate     sync.RWMutex // fail holds it to close the gate
	settling sync.WaitGroup
}

func (s *session) fail(err error) {
	s.gate.Lock()
	defer s.gate.Unlock()
	s.failOnce.Do(func() {
		s.failErr = err
		close(s.failed)
	})
}

// beginSettle reports whether a settlement may begin on the session: not
// once it has failed. A true result must be followed by settling.Done.
func (s *session) beginSettle() bool {
	s.gate.RLock()
	defer s.gate.RUnlock()
	if s.gone() {
		return false
	}
	s.settling.Add(1)
	return true
}

// waitSettled waits for the settlements under way, at most d.
func (s *session) waitSettled(d time.Duration) {
	done := make(chan struct{})
	go func() {
		s.settling.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.c.log.LogAttrs(context.Background(), slog.LevelWarn, "consumer: settlements still under way when the session closed; the broker redelivers them",
			slog.Duration("waited", d))
	}
}

// gone reports whether the session's connection or one of its channels has
// failed (acks on it are lost; the broker redelivers).
func (s *session) gone() bool {
	select {
	case <-s.failed:
		return true
	default:
		return false
	}
}

func (s *session) close() {
	s.fail(errors.New("consumer: session closed"))
	s.waitSettled(s.c.cfg.PublishTimeout)
	_ = s.conn.Close()
	if s.pubConn != nil {
		_ = s.pubConn.Close()
	}
	if s.pub != nil {
		s.pub.close()
	}
	s.loops.Wait()
}

// watch turns a close notification into the session's failure.
func (s *session) watch(what string, closed <-chan *amqp.Error) {
	go func() {
		select {
		case err, ok := <-closed:
			if ok && err != nil {
				s.fail(fmt.Errorf("consumer: %s closed: %w", what, err))
			} else {
				s.fail(fmt.Errorf("consumer: %s closed", what))
			}
		case <-s.failed:
		}
	}()
}

func (s *session) watchCancel(queue string, cancelled <-chan string) {
	go func() {
		select {
		case tag, ok := <-cancelled:
			if ok {
				s.fail(fmt.Errorf("consumer: broker cancelled consumer %s of queue %q (queue deleted or failed over)", tag, queue))
			}
		case <-s.failed:
		}
	}()
}

// connect dials, declares the topology of every route, opens the publisher
// and one channel per route, and starts consuming the queues that are not
// paused.
func (c *Consumer) connect(ctx context.Context) (*session, error) {
	conn, err := c.dial(ctx, c.cfg.Name, amqpdial.RoleConsumer)
	if err != nil {
		return nil, err
	}
	pubConn, err := c.dial(ctx, c.cfg.Name+" publisher", amqpdial.RolePublisher)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	s := &session{c: c, conn: conn, pubConn: pubConn, stopConsuming: make(chan struct{}), failed: make(chan struct{}),
		timeouts: consumerTimeouts(conn.Properties)}
	if err := c.open(s); err != nil {
		s.fail(err)
		s.close()
		return nil, err
	}
	return s, nil
}

func (c *Consumer) open(s *session) error {
	s.watch("connection", s.conn.NotifyClose(make(chan *amqp.Error, 1)))
	s.watch("publisher connection", s.pubConn.NotifyClose(make(chan *amqp.Error, 1)))
	for _, r := range c.routes {
		got, err := declareRoute(s.conn, r.Route)
		if err != nil {
			return err
		}
		if got.kept != "" {
			warnKeptType(c.log, r.Route, got.kept)
		}
		if got.legacy {
			warnLegacyQueue(c.log, s.conn.Config.Vhost, r.Route)
		}
		if got.direct {
			warnDirectQueue(c.log, r.Route)
		}
	}
	workers := 0
	for _, r := range c.routes {
		workers += r.Opts.Queue.Concurrency
	}
	pub, err := newPublisher(s.pubConn, c.cfg.PublishTimeout, workers, c.log)
	if err != nil {
		return err
	}
	s.pub = pub
	for _, r := range c.routes {
		if err := s.openDead(r); err != nil {
			return err
		}
		if r.Opts.Ordered != nil {
			s.openOrdered(r)
			continue
		}
		ch, err := s.conn.Channel()
		if err != nil {
			return fmt.Errorf("consumer: open channel for %q: %w", r.Queue, err)
		}
		if err := ch.Qos(r.Opts.Queue.Prefetch, 0, false); err != nil {
			return fmt.Errorf("consumer: set prefetch on %q: %w", r.Queue, err)
		}
		s.watch("channel of "+r.Queue, ch.NotifyClose(make(chan *amqp.Error, 1)))
		s.watchCancel(r.Queue, ch.NotifyCancel(make(chan string, 1)))
		var deliveries <-chan amqp.Delivery
		tag := ""
		if !r.isPaused() {
			tag = c.consumerTag(r.Queue)
			deliveries, err = ch.Consume(r.Queue, tag, false, false, false, false, c.consumeArgs(r, s.timeouts))
			if err != nil {
				return fmt.Errorf("consumer: consume %q: %w", r.Queue, err)
			}
		}
		s.loops.Add(1)
		go s.consumeLoop(r, ch, tag, deliveries)
	}
	return nil
}

var tagSeq atomic.Uint64

func (c *Consumer) consumerTag(queue string) string {
	tag := fmt.Sprintf("%s/%s/%d", c.cfg.Name, queue, tagSeq.Add(1))
	if len(tag) > 255 {
		tag = tag[len(tag)-255:]
	}
	return tag
}

// dial opens one connection to a node of Config.URL, bounded by ctx and
// Config.DialTimeout per node, with name as its connection_name property
// (Config.Name for the consuming connection, "<Name> publisher" for the
// one that publishes copies).
func (c *Consumer) dial(ctx context.Context, name, role string) (*amqp.Connection, error) {
	conn, _, err := c.dialer.Dial(ctx, name, role)
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	return conn, nil
}
