package lock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/lock"
	"github.com/inboxmq/inboxmq/internal/redistest"
	"github.com/inboxmq/inboxmq/internal/testenv"
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

// batcherBundle is a Batcher over a gated client, with a Locker on the
// same client.
type batcherBundle struct {
	rdb    redis.UniversalClient
	prefix string
	gc     *gatedClient
	locker *lock.Locker
	r      *lock.Batcher
}

func setupBatcher(t *testing.T) *batcherBundle {
	t.Helper()
	rdb, prefix := redistest.Client(t)
	gc := &gatedClient{UniversalClient: rdb, entered: make(chan struct{}), gate: make(chan struct{})}
	locker, err := lock.New(gc, nil)
	require.NoError(t, err)
	r, err := lock.NewBatcher(locker, nil)
	require.NoError(t, err)
	return &batcherBundle{rdb: rdb, prefix: prefix, gc: gc, locker: locker, r: r}
}

// holdRound releases l through r with gc's next script call held until
// gc.gate closes; it returns once that round trip is under way, with a
// channel for the release's answer.
func holdRound(t *testing.T, gc *gatedClient, r *lock.Batcher, l *lock.Lock) <-chan error {
	t.Helper()
	gc.armed.Store(true)
	done := make(chan error, 1)
	go func() { done <- r.Release(t.Context(), l) }()
	testenv.WaitChan(t, gc.entered, "a round trip under way")
	return done
}

// obtain takes n locks named prefix+name+i.
func (b *batcherBundle) obtain(t *testing.T, name string, n int) []*lock.Lock {
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
func TestBatcher_ConcurrentReleasesShareARoundTrip(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupBatcher(t)
	rdb, gc, r := b.rdb, b.gc, b.r
	const n = 10
	locks := b.obtain(t, "k", n)
	// The last lock expired and another holder took the key.
	lastKey, _ := lock.RedisKeys(locks[n-1].Key())
	require.NoError(t, rdb.Set(ctx, lastKey, "someone-else", time.Minute).Err())
	firstDone := holdRound(t, gc, r, locks[0])

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
func TestBatcher_EveryLockReleasedUnderConcurrency(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupBatcher(t)
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
func TestBatcher_GivingUpWhileQueuedWithdrawsTheRelease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupBatcher(t)
	rdb, gc, r := b.rdb, b.gc, b.r
	locks := b.obtain(t, "w", 2)
	first, second := locks[0], locks[1]

	firstDone := holdRound(t, gc, r, first)

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
func TestBatcher_NoHangWhenCallersGiveUp(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupBatcher(t) // the gate is never armed: a plain client
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
func TestBatcher_SenderSendsOneRoundTripAndHandsOn(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupBatcher(t)
	b.gc.pipeGate, b.gc.pipeEntered = make(chan struct{}), make(chan struct{}, 1)
	locks := b.obtain(t, "h", 3)

	firstDone := holdRound(t, b.gc, b.r, locks[0])
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

// Obtains and releases that arrive while a round trip is under way share
// the next one, in the order they came: a release of A then an obtain of A
// hands A over within the round, an obtain of a key another holder has is
// refused, and every obtained lock carries its fence and TTL.
func TestBatcher_ObtainsAndReleasesShareARoundTrip(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupBatcher(t)
	rdb, gc, r := b.rdb, b.gc, b.r
	a := b.obtain(t, "a", 1)[0]
	held := b.prefix + "held"
	heldKey, _ := lock.RedisKeys(held)
	require.NoError(t, rdb.Set(ctx, heldKey, "someone-else", time.Minute).Err())
	gate := b.obtain(t, "gate", 1)[0]

	gateDone := holdRound(t, gc, r, gate)

	before := time.Now()
	var (
		wg                  sync.WaitGroup
		releaseA            error
		gotA, gotB, gotHeld *lock.Lock
		errA, errB, errHeld error
	)
	queue := func(n int, f func()) {
		wg.Go(f)
		testenv.WaitFor(t, "queued", func() bool { return lock.Queued(r) == n })
	}
	queue(1, func() { releaseA = r.Release(ctx, a) })
	queue(2, func() { gotA, errA = r.Obtain(ctx, a.Key(), time.Minute) })
	queue(3, func() { gotB, errB = r.Obtain(ctx, b.prefix+"b", 30*time.Second) })
	queue(4, func() { gotHeld, errHeld = r.Obtain(ctx, held, time.Minute) })
	close(gc.gate)
	wg.Wait()
	require.NoError(t, testenv.WaitChan(t, gateDone, "the first round trip"))

	require.Equal(t, int64(1), gc.pipelines.Load(), "the four operations went out in one pipeline")
	require.NoError(t, releaseA)
	require.NoError(t, errA, "A was released earlier in the same round")
	require.Greater(t, gotA.Fence(), a.Fence(), "a new holder of A gets a greater fence")
	require.NoError(t, errB)
	require.Equal(t, int64(1), gotB.Fence())
	require.False(t, gotB.ObtainedAt().Before(before), "ObtainedAt is when the round was sent")
	require.ErrorIs(t, errHeld, lock.ErrNotObtained)
	var heldErr *lock.HeldError
	require.ErrorAs(t, errHeld, &heldErr, "a pipelined obtain tells the holder's TTL too")
	require.Positive(t, heldErr.TTL)
	require.Nil(t, gotHeld)
	require.Equal(t, "someone-else", rdb.Get(ctx, heldKey).Val())

	bKey, _ := lock.RedisKeys(gotB.Key())
	require.Equal(t, gotB.Token(), rdb.Get(ctx, bKey).Val())
	ttl := rdb.PTTL(ctx, bKey).Val()
	require.True(t, ttl > 29*time.Second && ttl <= 30*time.Second, "TTL %s", ttl)
	// The obtained locks are ordinary locks: they refresh and release.
	require.NoError(t, gotB.Refresh(ctx, 0))
	require.NoError(t, r.Release(ctx, gotB))
	require.NoError(t, gotA.Release(ctx))
}

// noScriptClient's pipelines send every EvalSha with an unknown digest, as
// after a Redis restart or SCRIPT FLUSH: the server answers NOSCRIPT.
type noScriptClient struct {
	redis.UniversalClient
}

func (c noScriptClient) Pipeline() redis.Pipeliner {
	return noScriptPipe{c.UniversalClient.Pipeline()}
}

type noScriptPipe struct{ redis.Pipeliner }

func (p noScriptPipe) EvalSha(ctx context.Context, _ string, keys []string, args ...any) *redis.Cmd {
	return p.Pipeliner.EvalSha(ctx, "0000000000000000000000000000000000000000", keys, args...)
}

// A shared round trip that meets NOSCRIPT answers each operation anyway,
// by sending it again with the script's source.
func TestBatcher_NoScriptInASharedRoundFallsBackToTheSource(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	rdb, prefix := redistest.Client(t)
	gc := &gatedClient{UniversalClient: noScriptClient{rdb}, entered: make(chan struct{}), gate: make(chan struct{})}
	locker, err := lock.New(gc, nil)
	require.NoError(t, err)
	r, err := lock.NewBatcher(locker, nil)
	require.NoError(t, err)
	first, err := locker.Obtain(ctx, prefix+"first", time.Minute, nil)
	require.NoError(t, err)
	old, err := locker.Obtain(ctx, prefix+"old", time.Minute, nil)
	require.NoError(t, err)

	firstDone := holdRound(t, gc, r, first)
	var wg sync.WaitGroup
	var relErr, obtErr error
	var got *lock.Lock
	wg.Go(func() { relErr = r.Release(ctx, old) })
	testenv.WaitFor(t, "release queued", func() bool { return lock.Queued(r) == 1 })
	wg.Go(func() { got, obtErr = r.Obtain(ctx, prefix+"new", time.Minute) })
	testenv.WaitFor(t, "obtain queued", func() bool { return lock.Queued(r) == 2 })
	close(gc.gate)
	wg.Wait()
	require.NoError(t, testenv.WaitChan(t, firstDone, "first release"))
	require.Equal(t, int64(1), gc.pipelines.Load())

	require.NoError(t, relErr)
	oldKey, _ := lock.RedisKeys(old.Key())
	require.Zero(t, rdb.Exists(ctx, oldKey).Val(), "released through the fallback")
	require.NoError(t, obtErr)
	newKey, _ := lock.RedisKeys(got.Key())
	require.Equal(t, got.Token(), rdb.Get(ctx, newKey).Val(), "obtained through the fallback")
	require.Equal(t, int64(1), got.Fence())
}

// An obtain whose caller gives up while it waits for a shared round trip is
// withdrawn: nothing is set in Redis, and the caller is told so.
func TestBatcher_GivingUpWhileQueuedWithdrawsTheObtain(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupBatcher(t)
	gate := b.obtain(t, "gate", 1)[0]
	gateDone := holdRound(t, b.gc, b.r, gate)

	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := b.r.Obtain(wctx, b.prefix+"w", time.Minute)
		done <- err
	}()
	testenv.WaitFor(t, "obtain queued", func() bool { return lock.Queued(b.r) == 1 })
	cancel()
	err := testenv.WaitChan(t, done, "obtain gave up")
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, "not sent")
	close(b.gc.gate)
	require.NoError(t, testenv.WaitChan(t, gateDone, "first release"))
	k, _ := lock.RedisKeys(b.prefix + "w")
	require.Zero(t, b.rdb.Exists(ctx, k).Val(), "the withdrawn obtain was not sent")
}

// Many goroutines obtaining and releasing the same few keys through one
// Batcher: at no time do two of them hold one key, and every fence of a
// key is greater than the one before.
func TestBatcher_MutualExclusionUnderConcurrency(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupBatcher(t)
	const workers, rounds, keys = 16, 40, 3
	var holders [keys]atomic.Int32
	var lastFence [keys]atomic.Int64
	var obtained atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				k := (w + i) % keys
				l, err := b.r.Obtain(ctx, b.prefix+"m"+strconv.Itoa(k), time.Minute)
				if errors.Is(err, lock.ErrNotObtained) {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				obtained.Add(1)
				if holders[k].Add(1) != 1 {
					errs <- fmt.Errorf("key %d held twice", k)
				}
				if prev := lastFence[k].Swap(l.Fence()); l.Fence() <= prev {
					errs <- fmt.Errorf("key %d: fence %d after %d", k, l.Fence(), prev)
				}
				holders[k].Add(-1)
				if err := b.r.Release(ctx, l); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Positive(t, obtained.Load())
}

// An operation whose context has already ended is not sent at all.
func TestBatcher_EndedContextSendsNothing(t *testing.T) {
	t.Parallel()
	b := setupBatcher(t)
	l := b.obtain(t, "e", 1)[0]
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := b.r.Obtain(ctx, b.prefix+"never", time.Minute)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, b.r.Release(ctx, l), context.Canceled)
	k, _ := lock.RedisKeys(b.prefix + "never")
	require.Zero(t, b.rdb.Exists(t.Context(), k).Val())
	k, _ = lock.RedisKeys(l.Key())
	require.Equal(t, l.Token(), b.rdb.Get(t.Context(), k).Val(), "not released")
	require.Zero(t, b.gc.pipelines.Load())
}
