package controlrun_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/internal/controlrun"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/startstop"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// fakeTarget records the calls a watcher makes and reports each one on
// calls.
type fakeTarget struct {
	mu    sync.Mutex
	state map[string]string
	fail  error
	calls chan string
}

func newFakeTarget() *fakeTarget {
	return &fakeTarget{state: map[string]string{}, calls: make(chan string, 64)}
}

func (f *fakeTarget) record(call string) error {
	f.mu.Lock()
	err := f.fail
	f.mu.Unlock()
	if err != nil {
		return err
	}
	f.calls <- call
	return nil
}

func (f *fakeTarget) Pause(q string) error  { return f.record("pause " + q) }
func (f *fakeTarget) Resume(q string) error { return f.record("resume " + q) }
func (f *fakeTarget) SetConcurrency(q string, n int) error {
	return f.record(fmt.Sprintf("concurrency %s %d", q, n))
}

type watcherBundle struct {
	pool   *pgxpool.Pool
	store  *control.Store
	target *fakeTarget
	w      *controlrun.Watcher
}

func setupWatcher(t *testing.T, cfg controlrun.WatcherConfig) *watcherBundle {
	t.Helper()
	pool, _ := pgtest.Schema(t)
	target := newFakeTarget()
	cfg.Target = target
	if cfg.Queues == nil {
		cfg.Queues = map[string]string{"payments": "payments.q"}
	}
	w, err := controlrun.NewWatcher(pool, &cfg)
	require.NoError(t, err)
	return &watcherBundle{pool: pool, store: control.NewStore(pool), target: target, w: w}
}

func (b *watcherBundle) start(t *testing.T) {
	t.Helper()
	require.NoError(t, b.w.Start(t.Context()))
	t.Cleanup(func() { require.NoError(t, b.w.Stop(context.Background())) })
}

func TestWatcher_AppliesPauseAndConcurrencyThroughNotify(t *testing.T) {
	t.Parallel()
	// A poll interval far beyond the test's timeout: only NOTIFY can
	// deliver the changes in time.
	b := setupWatcher(t, controlrun.WatcherConfig{PollInterval: time.Hour})
	b.start(t)
	ctx := t.Context()

	require.NoError(t, b.store.Pause(ctx, "payments", nil))
	require.Equal(t, "pause payments.q", testenv.WaitChan(t, b.target.calls, "pause applied"))
	require.NoError(t, b.store.SetConcurrency(ctx, "payments", 3, nil))
	require.Equal(t, "concurrency payments.q 3", testenv.WaitChan(t, b.target.calls, "concurrency applied"))
	require.NoError(t, b.store.Resume(ctx, "payments", nil))
	require.Equal(t, "resume payments.q", testenv.WaitChan(t, b.target.calls, "resume applied"))
	require.NoError(t, b.store.SetConcurrency(ctx, "payments", 0, nil))
	require.Equal(t, "concurrency payments.q 0", testenv.WaitChan(t, b.target.calls, "concurrency restored"))

	// Controls of namespaces this worker does not run are ignored.
	require.NoError(t, b.store.Pause(ctx, "emails", nil))
	require.NoError(t, b.w.Refresh(ctx))
	require.Empty(t, b.target.calls)
}

func TestWatcher_PollingFallback(t *testing.T) {
	t.Parallel()
	b := setupWatcher(t, controlrun.WatcherConfig{NoListen: true, PollInterval: 50 * time.Millisecond})
	b.start(t)

	require.NoError(t, b.store.Pause(t.Context(), "payments", nil))
	require.Equal(t, "pause payments.q", testenv.WaitChan(t, b.target.calls, "pause applied by polling"))
}

func TestWatcher_StartAppliesExistingState(t *testing.T) {
	t.Parallel()
	b := setupWatcher(t, controlrun.WatcherConfig{})
	require.NoError(t, b.store.Pause(t.Context(), "payments", nil))
	b.start(t)
	// Start applied it synchronously.
	require.Equal(t, "pause payments.q", <-b.target.calls)
}

func TestWatcher_RetriesFailedApply(t *testing.T) {
	t.Parallel()
	b := setupWatcher(t, controlrun.WatcherConfig{})
	ctx := t.Context()
	require.NoError(t, b.store.Pause(ctx, "payments", nil))
	b.target.fail = errors.New("consumer: not started")
	require.ErrorContains(t, b.w.Refresh(ctx), "not started")
	b.target.mu.Lock()
	b.target.fail = nil
	b.target.mu.Unlock()
	require.NoError(t, b.w.Refresh(ctx))
	require.Equal(t, "pause payments.q", <-b.target.calls)
}

func TestWatcher_BlockedFromSnapshot(t *testing.T) {
	t.Parallel()
	b := setupWatcher(t, controlrun.WatcherConfig{PollInterval: time.Hour})
	b.start(t)
	ctx := t.Context()
	require.False(t, b.w.Blocked("payments", "order:1"))

	v := b.w.Version()
	require.NoError(t, b.store.Block(ctx, control.Block{Namespace: "payments", Pattern: "order:", Prefix: true, Reason: "bad batch"}))
	testenv.WaitFor(t, "the block reaches the snapshot through NOTIFY", func() bool { return b.w.Version() > v && b.w.Blocked("payments", "order:1") })
	blk, ok := b.w.BlockedBy("payments", "order:1")
	require.True(t, ok)
	require.Equal(t, "bad batch", blk.Reason)
	require.False(t, b.w.Blocked("emails", "order:1"))
	require.False(t, b.w.Blocked("payments", "refund:1"))

	// Confirm reads the database, not the snapshot.
	_, err := b.store.Unblock(ctx, "payments", "order:", true)
	require.NoError(t, err)
	_, ok, err = b.w.Confirm(ctx, "payments", "order:1")
	require.NoError(t, err)
	require.False(t, ok)
	testenv.WaitFor(t, "the unblock reaches the snapshot", func() bool { return !b.w.Blocked("payments", "order:1") })
}

func TestWatcher_Config(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Schema(t)
	_, err := controlrun.NewWatcher(nil, nil)
	require.Error(t, err)
	_, err = controlrun.NewWatcher(pool, &controlrun.WatcherConfig{Target: newFakeTarget()})
	require.ErrorContains(t, err, "Queues")
	w, err := controlrun.NewWatcher(pool, nil)
	require.NoError(t, err)
	require.NoError(t, w.Stop(t.Context()), "Stop without Start")
	require.NotNil(t, w.Snapshot())
}

// TestWatcher_Lifecycle: Stop without Start and Stop twice are safe, a
// second Start is refused, Stop waits for the watch loop and its LISTEN
// connection is closed, and a stopped watcher starts again.
func TestWatcher_Lifecycle(t *testing.T) {
	t.Parallel()
	b := setupWatcher(t, controlrun.WatcherConfig{})
	w := b.w
	require.NoError(t, w.Stop(t.Context()), "Stop without Start")
	require.NoError(t, w.Start(t.Context()))
	require.ErrorIs(t, w.Start(t.Context()), startstop.ErrAlreadyStarted)
	stopped := w.Stopped()
	testenv.WaitFor(t, "the LISTEN connection is held", func() bool { return b.pool.Stat().AcquiredConns() == 1 })
	require.NoError(t, w.Stop(t.Context()))
	select {
	case <-stopped:
	default:
		t.Fatal("Stop returned before the watch loop ended")
	}
	// The pool destroys the closed LISTEN connection asynchronously.
	testenv.WaitFor(t, "the LISTEN connection is gone", func() bool { return b.pool.Stat().AcquiredConns() == 0 })
	require.NoError(t, w.Stop(t.Context()), "Stop twice")

	v := w.Version()
	require.NoError(t, w.Start(t.Context()), "a stopped watcher starts again")
	require.Greater(t, w.Version(), v, "Start loaded a snapshot")
	require.NoError(t, w.Stop(t.Context()))
}
