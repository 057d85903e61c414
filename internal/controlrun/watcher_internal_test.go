package controlrun

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// gatedDB holds the first Query of the blocks (the second statement of
// Store.List) until release is closed, after telling listing.
type gatedDB struct {
	control.DB
	once    sync.Once
	listing chan struct{}
	release chan struct{}
}

func (g *gatedDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if strings.Contains(sql, "FROM inboxmq_blocks") {
		first := false
		g.once.Do(func() { first = true })
		if first {
			close(g.listing)
			<-g.release
		}
	}
	return g.DB.Query(ctx, sql, args...)
}

func (g *gatedDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return g.DB.Exec(ctx, sql, args...)
}

type stateTarget struct {
	mu     sync.Mutex
	paused bool
}

func (t *stateTarget) Pause(string) error  { t.set(true); return nil }
func (t *stateTarget) Resume(string) error { t.set(false); return nil }
func (*stateTarget) SetConcurrency(string, int) error {
	return nil
}

func (t *stateTarget) set(p bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.paused = p
}

func (t *stateTarget) isPaused() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.paused
}

// A reload that read the controls before a resume must not apply them
// after a reload that read the resume: the watcher lists and applies
// under one lock, so a stale snapshot never re-pauses a resumed namespace.
func TestWatcher_StaleReloadNeverOverwritesANewerOne(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := pgtest.Schema(t)
	target := &stateTarget{}
	w, err := NewWatcher(pool, &WatcherConfig{Target: target, Queues: map[string]string{"payments": "payments"}})
	require.NoError(t, err)
	ops := control.NewStore(pool)
	require.NoError(t, ops.Pause(ctx, "payments", nil))
	require.NoError(t, w.Refresh(ctx))
	require.True(t, target.isPaused())

	gate := &gatedDB{DB: pool, listing: make(chan struct{}), release: make(chan struct{})}
	w.store = control.NewStore(gate)
	stale := make(chan error, 1)
	go func() { stale <- w.Refresh(ctx) }() // reads "paused", then waits
	testenv.WaitChan(t, gate.listing, "the first reload to read the controls")

	// While the stale reload holds its snapshot, no other reload may apply.
	locked := w.mu.TryLock()
	if locked {
		w.mu.Unlock()
	}
	require.False(t, locked, "a reload that is listing must hold the apply lock")

	require.NoError(t, ops.Resume(ctx, "payments", nil))
	fresh := make(chan error, 1)
	go func() { fresh <- w.Refresh(ctx) }()
	close(gate.release)
	require.NoError(t, testenv.WaitChan(t, stale, "the stale reload"))
	require.NoError(t, testenv.WaitChan(t, fresh, "the fresh reload"))
	require.False(t, target.isPaused(), "the resume must win: the last reload read it")
}
