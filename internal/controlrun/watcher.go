package controlrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/startstop"
)

// Target is what a [Watcher] drives: the running consumer. Its methods take
// the queue name; *consumer.Consumer satisfies it. SetConcurrency with n = 0
// restores the configured concurrency. Methods must be safe for concurrent
// use and must not block for long.
type Target interface {
	Pause(queue string) error
	Resume(queue string) error
	SetConcurrency(queue string, n int) error
}

// defaultPollInterval is the watcher's polling period when
// WatcherConfig.PollInterval is zero.
const defaultPollInterval = time.Second

// WatcherConfig configures a [Watcher]. A nil *WatcherConfig means the
// defaults: blocks only, no target.
type WatcherConfig struct {
	// Target receives pause, resume and concurrency changes. Defaults to nil:
	// the watcher only answers Blocked.
	Target Target
	// Queues maps each namespace this worker runs to its queue (see
	// [QueuesOf]). Controls of other namespaces are ignored. Defaults to nil,
	// which with a Target is an error.
	Queues map[string]string
	// PollInterval is how often the snapshot is reloaded when no
	// notification arrives (the fallback when LISTEN is unavailable, and a
	// safety net for lost notifications). Defaults to 1s, so a change is
	// picked up within about 1s even without LISTEN, and at once with it.
	PollInterval time.Duration
	// NoListen disables LISTEN/NOTIFY and makes the watcher poll only.
	// Defaults to false: one pool connection is held in LISTEN on
	// [control.Channel] (and closed, not returned, when the watcher stops).
	NoListen bool
	// Logger logs applied changes and errors. Defaults to nil, which
	// discards them.
	Logger *slog.Logger
}

// QueuesOf maps each route's namespace to its queue, for
// WatcherConfig.Queues.
func QueuesOf(r *consumer.Router) map[string]string {
	out := make(map[string]string)
	for _, rt := range r.Routes() {
		out[rt.Opts.Namespace] = rt.Queue
	}
	return out
}

type applied struct {
	paused      bool
	concurrency int
}

// Watcher keeps an in-memory snapshot of the runtime controls, reloaded on
// every NOTIFY on [control.Channel] and at least every PollInterval, applies
// pause/resume and concurrency changes to its [Target], and answers
// [Watcher.Blocked] from memory (no database query per delivery).
//
// The pickup time of a change is one notification's latency with LISTEN
// (milliseconds), and at most PollInterval plus one reload without it
// (about 1s by default; the documented bound is 2s).
type Watcher struct {
	pool   *pgxpool.Pool
	store  *control.Store
	cfg    WatcherConfig
	logger *slog.Logger

	snap atomic.Pointer[control.Snapshot]

	mu       sync.Mutex // guards applied and serialises reload+apply
	applied  map[string]applied
	reloadCh chan struct{}
	version  atomic.Uint64

	svc startstop.Service // the watch loop's lifecycle
}

// NewWatcher returns a watcher reading the controls through pool.
func NewWatcher(pool *pgxpool.Pool, cfg *WatcherConfig) (*Watcher, error) {
	if pool == nil {
		return nil, errors.New("controlrun: nil pool")
	}
	var c WatcherConfig
	if cfg != nil {
		c = *cfg
	}
	if c.PollInterval <= 0 {
		c.PollInterval = defaultPollInterval
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Target != nil && len(c.Queues) == 0 {
		return nil, errors.New("controlrun: WatcherConfig.Queues is required with a Target")
	}
	w := &Watcher{
		pool:     pool,
		store:    control.NewStore(pool),
		cfg:      c,
		logger:   c.Logger,
		applied:  make(map[string]applied),
		reloadCh: make(chan struct{}, 1),
		svc:      startstop.Service{Name: "controlrun: watcher"},
	}
	w.snap.Store(&control.Snapshot{})
	return w, nil
}

// Start loads the first snapshot, applies it to the target (so a consumer
// paused before the worker started stays paused) and starts the watch loop.
// It returns the first load's error, if any; the watcher then stays
// stopped and may be started again. ctx bounds only that first load; the
// loop runs until [Watcher.Stop]. A Start while the watcher runs returns an
// error. Call Start before the consumer takes deliveries (a Pause before
// consumer.Start makes it skip the queue).
func (w *Watcher) Start(ctx context.Context) error {
	return w.svc.Start(ctx, w.Refresh, w.run)
}

// Stop ends the watch loop and waits for it, bounded by ctx (if ctx ends
// first, it returns an error joined with ctx.Err() and the loop ends in the
// background). It is idempotent and safe without Start.
func (w *Watcher) Stop(ctx context.Context) error { return w.svc.Stop(ctx) }

// Stopped returns a channel closed when the watch loop started by the last
// Start has ended (closed before any Start).
func (w *Watcher) Stopped() <-chan struct{} { return w.svc.Stopped() }

// Snapshot returns the current in-memory snapshot (never nil; do not
// modify it).
func (w *Watcher) Snapshot() *control.Snapshot { return w.snap.Load() }

// Version counts the snapshots loaded so far; it increases by one on every
// successful reload.
func (w *Watcher) Version() uint64 { return w.version.Load() }

// Blocked reports whether key is blocked for namespace, from the
// in-memory snapshot.
func (w *Watcher) Blocked(namespace, key string) bool {
	_, ok := w.BlockedBy(namespace, key)
	return ok
}

// BlockedBy returns the block that matches key for namespace, from the
// in-memory snapshot.
func (w *Watcher) BlockedBy(namespace, key string) (control.Block, bool) {
	for _, b := range w.snap.Load().Blocks {
		if b.Namespace == namespace && b.Matches(key) {
			return b, true
		}
	}
	return control.Block{}, false
}

// Confirm re-checks a snapshot hit against the database: it reports whether
// key is still blocked for namespace now, and schedules a reload when
// the snapshot was stale. The Block middleware calls it before parking, so
// a delivery released by an unblock is never parked again by a worker that
// has not yet seen the change.
func (w *Watcher) Confirm(ctx context.Context, namespace, key string) (control.Block, bool, error) {
	b, ok, err := w.store.Blocked(ctx, namespace, key)
	if err == nil && !ok {
		w.trigger()
	}
	return b, ok, err
}

func (w *Watcher) trigger() {
	select {
	case w.reloadCh <- struct{}{}:
	default:
	}
}

// Refresh reloads the snapshot now and applies it to the target.
func (w *Watcher) Refresh(ctx context.Context) error {
	// Read and apply under one lock: a reload that read the controls
	// before a change must not apply them after one that read the change.
	w.mu.Lock()
	defer w.mu.Unlock()
	snap, err := w.store.List(ctx)
	if err != nil {
		return err
	}
	w.snap.Store(snap)
	w.version.Add(1)
	return w.apply(snap)
}

// apply drives the target towards snap; w.mu is held. A failed call is
// retried on the next reload (the applied state is not updated).
func (w *Watcher) apply(snap *control.Snapshot) error {
	if w.cfg.Target == nil {
		return nil
	}
	want := make(map[string]applied, len(w.cfg.Queues))
	for _, c := range snap.Controls {
		if _, ok := w.cfg.Queues[c.Namespace]; ok {
			want[c.Namespace] = applied{paused: c.Paused, concurrency: c.Concurrency}
		}
	}
	var errs []error
	for name, queue := range w.cfg.Queues {
		target, have := want[name], w.applied[name]
		if target.concurrency != have.concurrency {
			if err := w.cfg.Target.SetConcurrency(queue, target.concurrency); err != nil {
				errs = append(errs, fmt.Errorf("controlrun: set concurrency of %s to %d: %w", queue, target.concurrency, err))
			} else {
				have.concurrency = target.concurrency
				w.logger.LogAttrs(context.Background(), slog.LevelInfo, "controlrun: concurrency set",
					slog.String("namespace", name), slog.String("queue", queue), slog.Int("concurrency", target.concurrency))
			}
		}
		if target.paused != have.paused {
			var err error
			if target.paused {
				err = w.cfg.Target.Pause(queue)
			} else {
				err = w.cfg.Target.Resume(queue)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("controlrun: pause=%v %s: %w", target.paused, queue, err))
			} else {
				have.paused = target.paused
				w.logger.LogAttrs(context.Background(), slog.LevelInfo, "controlrun: pause changed",
					slog.String("namespace", name), slog.String("queue", queue), slog.Bool("paused", target.paused))
			}
		}
		w.applied[name] = have
	}
	return errors.Join(errs...)
}

// run is the watch loop: LISTEN when possible, reload on each notification
// and every PollInterval.
func (w *Watcher) run(ctx context.Context) error {
	for ctx.Err() == nil {
		if !w.cfg.NoListen {
			if err := w.listen(ctx); err != nil && ctx.Err() == nil {
				w.logger.LogAttrs(ctx, slog.LevelWarn, "controlrun: LISTEN failed; polling", slog.Any("error", err))
			}
		}
		// Poll for one interval (also the back-off before listening again).
		w.wait(ctx, w.cfg.PollInterval)
		w.reload(ctx)
	}
	return nil
}

func (w *Watcher) wait(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-w.reloadCh:
	}
}

func (w *Watcher) reload(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := w.Refresh(rctx); err != nil && ctx.Err() == nil {
		w.logger.LogAttrs(ctx, slog.LevelWarn, "controlrun: reload failed", slog.Any("error", err))
	}
}

// listen holds one connection in LISTEN until it fails or ctx ends,
// reloading on every notification and every PollInterval.
func (w *Watcher) listen(ctx context.Context) error {
	conn, err := w.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer func() {
		// The connection carries a LISTEN; close it rather than return it.
		_ = conn.Conn().Close(context.Background())
		conn.Release()
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+control.Channel); err != nil {
		return err
	}
	// Changes made before LISTEN took effect are caught by this reload.
	w.reload(ctx)
	for {
		wctx, cancel := context.WithTimeout(ctx, w.cfg.PollInterval)
		_, err := conn.Conn().WaitForNotification(wctx)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		select {
		case <-w.reloadCh:
		default:
		}
		w.reload(ctx)
	}
}
