package lock_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/redistest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/lock"
)

// gatedClient holds the first script call until gate closes, and counts
// the pipelines sent. With pipeGate set, each pipeline's Exec signals
// pipeEntered and waits for pipeGate.
type gatedClient struct {
	redis.UniversalClient
	armed       atomic.Bool
	first       sync.Once
	entered     chan struct{}
	gate        chan struct{}
	pipelines   atomic.Int64
	pipeGate    chan struct{}
	pipeEntered chan struct{}
}

func (c *gatedClient) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	if c.armed.Load() {
		c.first.Do(func() {
			close(c.entered)
			<-c.gate
		})
	}
	return c.UniversalClient.EvalSha(ctx, sha, keys, args...)
}

func (c *gatedClient) Pipeline() redis.Pipeliner {
	c.pipelines.Add(1)
	if c.pipeGate == nil {
		return c.UniversalClient.Pipeline()
	}
	return gatedPipe{Pipeliner: c.UniversalClient.Pipeline(), c: c}
}

type gatedPipe struct {
	redis.Pipeliner
	c *gatedClient
}

func (p gatedPipe) Exec(ctx context.Context) ([]redis.Cmder, error) {
	p.c.pipeEntered <- struct{}{}
	<-p.c.pipeGate
	return p.Pipeliner.Exec(ctx)
}

// releaserBundle is a Releaser over a gated client, with a Locker on the
// same client.
type releaserBundle struct {
	rdb    redis.UniversalClient
	prefix string
	gc     *gatedClient
	locker *lock.Locker
	r      *lock.Releaser
}

func setupReleaser(t *testing.T) *releaserBundle {
	t.Helper()
	rdb, prefix := redistest.Client(t)
	gc := &gatedClient{UniversalClient: rdb, entered: make(chan struct{}), gate: make(chan struct{})}
	locker, err := lock.New(gc, nil)
	require.NoError(t, err)
	r, err := lock.NewReleaser(gc, nil)
	require.NoError(t, err)
	return &releaserBundle{rdb: rdb, prefix: prefix, gc: gc, locker: locker, r: r}
}

// obtain takes n locks named prefix+name+i.
func (b *releaserBundle) obtain(t *testing.T, name string, n int) []*lock.Lock {
	t.Helper()
	locks := make([]*lock.Lock, n)
	for i := range locks {
		var err error
		locks[i], err = b.locker.Obtain(t.Context(), b.prefix+name+strconv.Itoa(i), time.Minute, nil)
		require.NoError(t, err)
	}
	return locks
}

// Releases that arrive while a round trip is under way share the next one;
// each keeps compare-and-delete: a lock taken over by another holder is
// not deleted, and its release reports ErrNotHeld.
func TestReleaser_ConcurrentReleasesShareARoundTrip(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupReleaser(t)
	rdb, gc, r := b.rdb, b.gc, b.r
	const n = 10
	locks := b.obtain(t, "k", n)
	// The last lock expired and another holder took the key.
	lastKey, _ := lock.RedisKeys(locks[n-1].Key())
	require.NoError(t, rdb.Set(ctx, lastKey, "someone-else", time.Minute).Err())
	gc.armed.Store(true) // the next script call, the first release, waits
	firstDone := make(chan error, 1)
	go func() { firstDone <- r.Release(ctx, locks[0]) }()
	testenv.WaitChan(t, gc.entered, "the first release's round trip under way")

	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 1; i < n; i++ {
		wg.Go(func() { errs[i] = r.Release(ctx, locks[i]) })
	}
	testenv.WaitFor(t, "releases queued behind the round trip", func() bool { return lock.Queued(r) == n-1 })
	close(gc.gate)
	wg.Wait()
	require.NoError(t, testenv.WaitChan(t, firstDone, "first release"))

	for i := 1; i < n-1; i++ {
		require.NoError(t, errs[i], "lock %d", i)
		k, _ := lock.RedisKeys(locks[i].Key())
		require.Zero(t, rdb.Exists(ctx, k).Val(), "lock %d released", i)
	}
	require.ErrorIs(t, errs[n-1], lock.ErrNotHeld)
	require.Equal(t, "someone-else", rdb.Get(ctx, lastKey).Val(), "another holder's lock is not deleted")
	require.Equal(t, int64(1), gc.pipelines.Load(), "the queued releases went out in one pipeline")
}

// Several goroutines releasing many locks: every one is released, whatever
// way the releases are grouped.
func TestReleaser_EveryLockReleasedUnderConcurrency(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupReleaser(t)
	const n = 200
	locks := b.obtain(t, "c", n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range locks {
		wg.Go(func() { errs[i] = b.r.Release(ctx, locks[i]) })
	}
	wg.Wait()
	for i, l := range locks {
		require.NoError(t, errs[i])
		k, _ := lock.RedisKeys(l.Key())
		require.Zero(t, b.rdb.Exists(ctx, k).Val())
	}
}

// A release whose caller gives up while it waits for a shared round trip
// is withdrawn, not sent: the lock stays until its TTL, and the caller is
// told so.
func TestReleaser_GivingUpWhileQueuedWithdrawsTheRelease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupReleaser(t)
	rdb, gc, r := b.rdb, b.gc, b.r
	locks := b.obtain(t, "w", 2)
	first, second := locks[0], locks[1]

	gc.armed.Store(true)
	firstDone := make(chan error, 1)
	go func() { firstDone <- r.Release(ctx, first) }()
	testenv.WaitChan(t, gc.entered, "the first release's round trip under way")

	wctx, cancel := context.WithCancel(ctx)
	secondDone := make(chan error, 1)
	go func() { secondDone <- r.Release(wctx, second) }()
	testenv.WaitFor(t, "second release queued", func() bool { return lock.Queued(r) == 1 })
	cancel()
	err := testenv.WaitChan(t, secondDone, "second release gave up")
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, lock.Queued(r), "withdrawn")

	close(gc.gate)
	require.NoError(t, testenv.WaitChan(t, firstDone, "first release"))
	k, _ := lock.RedisKeys(second.Key())
	require.Equal(t, int64(1), rdb.Exists(ctx, k).Val(), "the withdrawn release was not sent")
	require.NoError(t, r.Release(ctx, second), "and can be sent again")
}

// Callers that give up at random while others keep releasing: nobody hangs
// (the next round trip always finds a sender), and every release reported
// done really deleted its lock.
func TestReleaser_NoHangWhenCallersGiveUp(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupReleaser(t) // the gate is never armed: a plain client
	rdb, r := b.rdb, b.r
	const n = 300
	locks := b.obtain(t, "g", n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range locks {
		wg.Go(func() {
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			if i%3 == 0 {
				cancel() // gives up at once: withdrawn if it had to wait
			}
			errs[i] = r.Release(cctx, locks[i])
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	testenv.WaitChan(t, done, "every Release returned")
	for i, l := range locks {
		k, _ := lock.RedisKeys(l.Key())
		if errs[i] == nil {
			require.Zero(t, rdb.Exists(ctx, k).Val(), "lock %d reported released", i)
		}
	}
	require.Zero(t, lock.Queued(r))
}

// The caller that sent a round trip returns once its own answer is in: the
// releases that queued behind it are sent by one of their own callers, not
// by it (the next round trip is held here, and the first caller is back).
func TestReleaser_SenderSendsOneRoundTripAndHandsOn(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupReleaser(t)
	b.gc.pipeGate, b.gc.pipeEntered = make(chan struct{}), make(chan struct{}, 1)
	locks := b.obtain(t, "h", 3)

	b.gc.armed.Store(true)
	firstDone := make(chan error, 1)
	go func() { firstDone <- b.r.Release(ctx, locks[0]) }()
	testenv.WaitChan(t, b.gc.entered, "the first round trip under way")
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() { errs[i] = b.r.Release(ctx, locks[i+1]) })
	}
	testenv.WaitFor(t, "two releases queued", func() bool { return lock.Queued(b.r) == 2 })
	close(b.gc.gate)

	require.NoError(t, testenv.WaitChan(t, firstDone, "the first caller is back while the next round trip is held"))
	testenv.WaitChan(t, b.gc.pipeEntered, "the next round trip, sent by a waiter")
	close(b.gc.pipeGate)
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	for _, l := range locks {
		k, _ := lock.RedisKeys(l.Key())
		require.Zero(t, b.rdb.Exists(ctx, k).Val())
	}
}
