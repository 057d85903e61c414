package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmq/inboxmq/internal/amqpdial"
	"github.com/inboxmq/inboxmq/internal/confirm"
	"github.com/inboxmq/inboxmq/internal/startstop"
)

// Relay publishes the outbox's pending rows to RabbitMQ with publisher
// confirms and marks them sent after the confirm. Several relays (in one
// process or many) may run against the same table: a row is claimed by one
// relay at a time and the others skip it, so in normal operation every row
// is published once. A relay that dies between the confirm and the mark leaves
// its rows pending; they are published again with the same message id, a
// duplicate that the receiver's inbox absorbs.
//
// A Relay is safe for concurrent use; it runs in the background between
// [Relay.Start] and [Relay.Stop], once at a time.
type Relay struct {
	pool    *pgxpool.Pool
	cfg     Config
	dialer  *amqpdial.Dialer
	log     *slog.Logger
	metrics *metrics
	tracer  trace.Tracer
	hooks   testHooks

	spanName spanName // of the publish spans

	killed atomic.Bool // set by a test hook's kill; stops every lane
	// wake is the lanes' shared wake-up, fed by the LISTEN connection and
	// by Wake.
	wake chan struct{}
	// inFlight counts the lanes running batches: a lane woken while
	// another is busy gathers too (rows keep arriving).
	inFlight atomic.Int32
	// props is true until a statement finds that the outbox table has no
	// properties column (schedule.go).
	props atomic.Bool

	svc startstop.Service // the lanes' lifecycle
}

// testHooks let internal tests inject faults. The zero value does nothing.
type testHooks struct {
	// afterConfirm runs after the broker confirmed a batch and before the
	// rows are marked sent. A non-nil error aborts the batch (its
	// transaction rolls back) and the relay "dies": it stops, and Stop
	// returns the error.
	afterConfirm func(messageIDs []string) error
	// listening runs each time the LISTEN connection is ready.
	listening func()
	// idle runs when a lane found no more rows and is about to wait;
	// wakePending reports whether a wake-up is already queued for it.
	idle func(wakePending bool)
	// claimed runs after each claim with the number of rows it took.
	claimed func(rows int)
	// gather runs when a lane waits GatherDelay before its next claim.
	gather func()
	// published runs after a batch's confirms, before the lane decides
	// whether rows keep coming (a wake-up is pending on wake).
	published func(wake <-chan struct{})
	// held runs when a batch has been handed to amqp091, its socket
	// writes still held.
	held func(conn *amqpdial.HoldConn)
	// released runs after the held writes of a batch of rows went out,
	// with the number of socket writes the batch took and the error.
	released func(rows int, writes int64, err error)
}

// New returns a relay that publishes the outbox table of pool's
// search_path. cfg must set URL; nil is an invalid config.
func New(pool *pgxpool.Pool, cfg *Config) (*Relay, error) {
	if pool == nil {
		return nil, errors.New("relay: New: nil pool")
	}
	if cfg == nil {
		return nil, errors.New("relay: New: nil config (Config.URL is required)")
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	dialer, err := amqpdial.New(amqpdial.Config{
		URL: c.URL, Timeout: 10 * time.Second, OnNode: c.OnBrokerNode,
		Logger: c.Logger.With(slog.String("component", "outbox-relay")),
	})
	if err != nil {
		return nil, fmt.Errorf("relay: Config.URL: %w", err)
	}
	m, err := newMetrics(c.Registerer)
	if err != nil {
		return nil, fmt.Errorf("relay: register metrics: %w", err)
	}
	r := &Relay{
		pool:    pool,
		cfg:     c,
		dialer:  dialer,
		log:     c.Logger.With(slog.String("component", "outbox-relay"), slog.String("connection_name", c.ConnectionName)),
		metrics: m,
		tracer:  c.TracerProvider.Tracer("github.com/inboxmq/inboxmq/outbox"),
		svc:     startstop.Service{Name: "relay"},
		wake:    make(chan struct{}, 1),
	}
	r.props.Store(true)
	return r, nil
}

// run relays until ctx is done, then returns nil; it returns early only
// with a test hook's kill.
func (r *Relay) run(ctx context.Context) error {
	r.killed.Store(false)

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// The lanes share one wake-up: a NOTIFY wakes one idle lane (or, with
	// none idle, the first to finish its batch), not every lane, of which
	// all but one would then claim nothing and pay a transaction for it.
	// A lane that claims a full batch wakes another to help.
	wake := r.wake
	lanes := make([]*lane, r.cfg.Concurrency)
	for i := range lanes {
		lanes[i] = &lane{index: i, wake: wake}
	}
	wakes := []chan struct{}{wake}
	r.log.LogAttrs(ctx, slog.LevelInfo, "outbox relay starting", slog.String("url", redactURL(r.cfg.URL)),
		slog.Int("concurrency", r.cfg.Concurrency))
	var wg sync.WaitGroup
	wg.Go(func() { r.listen(ctx, wakes) })
	if r.cfg.Retention > 0 {
		wg.Go(func() { r.retain(ctx) })
	}
	for _, l := range lanes {
		wg.Go(func() {
			defer l.closeBroker()
			if err := r.runLane(ctx, l); err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	r.log.LogAttrs(ctx, slog.LevelInfo, "outbox relay stopped")
	var killed *killedError
	if err := context.Cause(ctx); errors.As(err, &killed) {
		return killed.err
	}
	return nil
}

// lane is one batch loop with its own broker connection and confirm
// channel; a relay runs Concurrency lanes, so one lane publishes while
// another commits. Lanes claim with SKIP LOCKED, like separate relays.
type lane struct {
	index int
	wake  chan struct{} // shared by the relay's lanes
	conn  *amqp.Connection
	sock  *amqpdial.HoldConn // conn's socket: a batch's publishes go out in one write
	pool  *confirm.Pool      // conn's one confirm channel
	msgs  []confirm.Message  // a batch's messages, kept for the next batch
	rows  []int              // the batch row of each of msgs
}

// runLane relays batches until ctx is done. It returns only a test hook's
// kill.
func (r *Relay) runLane(ctx context.Context, l *lane) error {
	bo := r.newBackOff()
	var lastStats time.Time
	for ctx.Err() == nil {
		if l.index == 0 && time.Since(lastStats) >= r.cfg.StatsInterval {
			lastStats = time.Now()
			r.refreshStats(ctx)
		}
		if l.pool == nil {
			if err := r.connect(ctx, l); err != nil {
				d := bo.NextBackOff()
				r.log.LogAttrs(ctx, slog.LevelWarn, "outbox relay: broker connect failed",
					slog.Any("error", err), slog.Duration("retry_in", d))
				sleep(ctx, d)
				continue
			}
		}
		n, err := r.relayBatch(ctx, l)
		var killed *killedError
		if errors.As(err, &killed) {
			return killed
		}
		if err != nil {
			var be *brokerError
			if errors.As(err, &be) {
				l.closeBroker()
			}
			d := bo.NextBackOff()
			r.log.LogAttrs(ctx, slog.LevelWarn, "outbox relay: batch failed",
				slog.Any("error", err), slog.Int("rows", n), slog.Duration("retry_in", d))
			if be != nil {
				sleep(ctx, d)
				continue
			}
			// A database failure: a row enqueued meanwhile (its NOTIFY)
			// says the database answers again, so it ends the wait early
			// instead of leaving the row for up to ReconnectMaxDelay.
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
			case <-l.wake:
			case <-t.C:
			}
			t.Stop()
			continue
		}
		bo.Reset()
		if n == r.cfg.BatchSize {
			notify(l.wake) // more may be waiting: another idle lane helps
			continue
		}
		// A wake-up that came while this batch ran, or one that comes
		// while another lane is busy, means rows keep arriving: gathering
		// them a moment longer makes the next batch bigger, and each round
		// trip serve more rows. A lane woken after a quiet spell (no lane
		// busy) claims at once.
		busy := n > 0 && len(l.wake) > 0
		if r.hooks.idle != nil {
			r.hooks.idle(len(l.wake) > 0)
		}
		t := time.NewTimer(r.cfg.PollInterval)
		select {
		case <-ctx.Done():
		case <-l.wake:
			if (busy || r.inFlight.Load() > 0) && r.cfg.GatherDelay > 0 {
				if r.hooks.gather != nil {
					r.hooks.gather()
				}
				sleep(ctx, r.cfg.GatherDelay)
			}
		case <-t.C:
		}
		t.Stop()
	}
	return nil
}

// Start runs the relay in the background until [Relay.Stop]; ctx's
// cancellation does not stop it, so it can still publish what the last
// commits enqueued while the rest of the process stops (a row it has not
// published when it stops stays in the table for the next relay). The relay keeps going through
// broker and database outages (rows wait in the table and go out after the
// reconnect). A Start while the relay runs returns an error.
func (r *Relay) Start(ctx context.Context) error {
	return r.svc.Start(ctx, nil, r.run)
}

// Stop stops the relay and waits for it, bounded by ctx: the batches in
// flight are finished first (bounded by publishTimeout, 30s). If ctx ends
// first, it returns an error joined with ctx.Err() and the relay ends in
// the background. Stop is idempotent and safe without a Start.
func (r *Relay) Stop(ctx context.Context) error { return r.svc.Stop(ctx) }

// Stopped returns a channel closed when the relay started by the last
// Start has stopped (closed before any Start).
func (r *Relay) Stopped() <-chan struct{} { return r.svc.Stopped() }

func (r *Relay) newBackOff() *backoff.ExponentialBackOff {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = r.cfg.ReconnectMinDelay
	bo.MaxInterval = r.cfg.ReconnectMaxDelay
	bo.MaxElapsedTime = 0 // never give up: rows wait for the broker
	bo.Reset()
	return bo
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// brokerError marks a failure of the AMQP connection or channel: the relay
// drops the connection and reconnects.
type brokerError struct{ err error }

func (e *brokerError) Error() string { return "relay: broker: " + e.err.Error() }
func (e *brokerError) Unwrap() error { return e.err }

// killedError carries a test hook's error out of run.
type killedError struct{ err error }

func (e *killedError) Error() string { return e.err.Error() }
func (e *killedError) Unwrap() error { return e.err }

func (r *Relay) connect(ctx context.Context, l *lane) error {
	conn, sock, node, err := r.dialer.DialHeld(ctx, r.cfg.ConnectionName+" #"+strconv.Itoa(l.index), amqpdial.RoleRelay)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	pool, err := confirm.NewPool(conn, 1, 1)
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("relay: %w", err)
	}
	l.conn, l.sock, l.pool = conn, sock, pool
	r.log.LogAttrs(ctx, slog.LevelInfo, "outbox relay connected", slog.String("node", node.Addr),
		slog.String("url", node.Redacted()), slog.Int("lane", l.index))
	return ctx.Err()
}

func (l *lane) closeBroker() {
	if l.conn != nil {
		_ = l.conn.Close()
		l.pool.Close()
	}
	l.conn, l.sock, l.pool = nil, nil, nil
}
