package combine_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/combine"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// req is a test operation: the round answers it with the round's number.
type req struct {
	key   string
	round int64
}

// rig is a Combiner whose rounds can be held: with hold set, each round
// signals entered and waits for release.
type rig struct {
	c        *combine.Combiner[*req]
	rounds   atomic.Int64
	hold     atomic.Bool
	entered  chan []string
	release  chan struct{}
	panicKey string
}

func newRig(split func([]*req) []bool) *rig {
	r := &rig{entered: make(chan []string, 16), release: make(chan struct{})}
	r.c = combine.New(func(batch []*req) {
		n := r.rounds.Add(1)
		if r.hold.Load() {
			keys := make([]string, len(batch))
			for i, q := range batch {
				keys[i] = q.key
			}
			r.entered <- keys
			<-r.release
		}
		for _, q := range batch {
			if q.key == r.panicKey {
				panic("boom")
			}
			q.round = n
		}
	}, split)
	return r
}

// Operations that arrive while a round is under way share the next one,
// and the sender of a round sends only that one: the next is sent by one
// of the callers that queued behind it.
func TestCombiner_QueuedOperationsShareTheNextRound(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.hold.Store(true)
	first := &req{key: "first"}
	firstDone := make(chan error, 1)
	go func() { firstDone <- r.c.Do(t.Context(), first) }()
	require.Equal(t, []string{"first"}, testenv.WaitChan(t, r.entered, "first round under way"))

	const n = 5
	reqs := make([]*req, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range reqs {
		reqs[i] = &req{key: "k"}
		wg.Go(func() { errs[i] = r.c.Do(t.Context(), reqs[i]) })
	}
	testenv.WaitFor(t, "all queued", func() bool { return r.c.Queued() == n })
	r.release <- struct{}{}
	require.NoError(t, testenv.WaitChan(t, firstDone, "the first caller returns after its own round"))
	require.Len(t, testenv.WaitChan(t, r.entered, "the second round, sent by a waiter"), n)
	r.release <- struct{}{}
	wg.Wait()
	for i, q := range reqs {
		require.NoError(t, errs[i])
		require.Equal(t, int64(2), q.round, "one shared round")
	}
	require.Equal(t, int64(1), first.round)
	require.Zero(t, r.c.Queued())
}

// split keeps operations that may not share a round (here: the same key)
// for a later one, in order.
func TestCombiner_SplitDefersConflictingOperations(t *testing.T) {
	t.Parallel()
	distinct := func(q []*req) []bool {
		seen := map[string]bool{}
		now := make([]bool, len(q))
		for i, x := range q {
			now[i] = !seen[x.key]
			seen[x.key] = true
		}
		return now
	}
	r := newRig(distinct)
	r.hold.Store(true)
	gate := &req{key: "gate"}
	gateDone := make(chan error, 1)
	go func() { gateDone <- r.c.Do(t.Context(), gate) }()
	testenv.WaitChan(t, r.entered, "a round under way")

	keys := []string{"a", "b", "a", "c", "a"}
	reqs := make([]*req, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		reqs[i] = &req{key: k}
		wg.Go(func() { errs[i] = r.c.Do(t.Context(), reqs[i]) })
		testenv.WaitFor(t, "queued in order", func() bool { return r.c.Queued() == i+1 })
	}
	r.release <- struct{}{}
	require.NoError(t, testenv.WaitChan(t, gateDone, "gate"))
	require.Equal(t, []string{"a", "b", "c"}, testenv.WaitChan(t, r.entered, "round 2"))
	r.release <- struct{}{}
	require.Equal(t, []string{"a"}, testenv.WaitChan(t, r.entered, "round 3"))
	r.release <- struct{}{}
	require.Equal(t, []string{"a"}, testenv.WaitChan(t, r.entered, "round 4"))
	r.release <- struct{}{}
	wg.Wait()
	rounds := []int64{2, 2, 3, 2, 4}
	for i, q := range reqs {
		require.NoError(t, errs[i])
		require.Equal(t, rounds[i], q.round, "request %d (%s)", i, q.key)
	}
}

// A caller that gives up while queued is withdrawn and told so; one that
// had given up before is never queued.
func TestCombiner_GivingUpWhileQueuedWithdraws(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.hold.Store(true)
	gateDone := make(chan error, 1)
	go func() { gateDone <- r.c.Do(t.Context(), &req{key: "gate"}) }()
	testenv.WaitChan(t, r.entered, "a round under way")

	ctx, cancel := context.WithCancel(t.Context())
	q := &req{key: "w"}
	done := make(chan error, 1)
	go func() { done <- r.c.Do(ctx, q) }()
	testenv.WaitFor(t, "queued", func() bool { return r.c.Queued() == 1 })
	cancel()
	require.ErrorIs(t, testenv.WaitChan(t, done, "gave up"), context.Canceled)
	require.Zero(t, r.c.Queued())
	require.ErrorIs(t, r.c.Do(ctx, &req{key: "late"}), context.Canceled)
	require.Zero(t, r.c.Queued())

	r.release <- struct{}{}
	require.NoError(t, testenv.WaitChan(t, gateDone, "gate"))
	require.Equal(t, int64(1), r.rounds.Load(), "nothing else was sent")
	require.Zero(t, q.round)
}

// DoBy's deadline bounds the wait as a context deadline would: a queued
// operation whose deadline passes is withdrawn, not sent, with
// context.DeadlineExceeded; one past its deadline already is refused; one
// whose deadline is still ahead when its round comes is sent.
func TestCombiner_DoByDeadlineWithdrawsLikeAContextDeadline(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.hold.Store(true)
	gateDone := make(chan error, 1)
	go func() { gateDone <- r.c.Do(t.Context(), &req{key: "gate"}) }()
	testenv.WaitChan(t, r.entered, "a round under way")

	q := &req{key: "w"}
	done := make(chan error, 1)
	go func() { done <- r.c.DoBy(t.Context(), time.Now().Add(50*time.Millisecond), q) }()
	kept := &req{key: "kept"}
	keptDone := make(chan error, 1)
	go func() { keptDone <- r.c.DoBy(t.Context(), time.Now().Add(testenv.Timeout()), kept) }()
	testenv.WaitFor(t, "both queued", func() bool { return r.c.Queued() == 2 })
	require.ErrorIs(t, testenv.WaitChan(t, done, "gave up by its deadline"), context.DeadlineExceeded)
	require.Equal(t, 1, r.c.Queued(), "withdrawn; the other stays")
	require.ErrorIs(t, r.c.DoBy(t.Context(), time.Now().Add(-time.Millisecond), &req{key: "late"}), context.DeadlineExceeded)

	r.hold.Store(false)
	r.release <- struct{}{}
	require.NoError(t, testenv.WaitChan(t, gateDone, "gate"))
	require.NoError(t, testenv.WaitChan(t, keptDone, "kept"))
	require.Equal(t, int64(2), r.rounds.Load(), "the gate's round and kept's")
	require.Equal(t, int64(2), kept.round)
	require.Zero(t, q.round, "never sent")
}

// A round whose send panics: the panic goes on in the caller that sent
// the round (where its own guard sees it, stack and all), every other
// caller of the round gets ErrRoundPanicked instead of waiting for ever,
// and the combiner goes on: later rounds run.
func TestCombiner_PanickingRoundPanicsItsSenderFailsTheOthersAndGoesOn(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.panicKey = "bad"
	r.hold.Store(true)
	gateDone := make(chan error, 1)
	go func() { gateDone <- r.c.Do(t.Context(), &req{key: "gate"}) }()
	testenv.WaitChan(t, r.entered, "a round under way")
	errs := make([]error, 2)
	panics := make([]any, 2)
	var wg sync.WaitGroup
	for i, k := range []string{"ok", "bad"} {
		wg.Go(func() {
			defer func() { panics[i] = recover() }()
			errs[i] = r.c.Do(t.Context(), &req{key: k})
		})
		testenv.WaitFor(t, "queued", func() bool { return r.c.Queued() == i+1 })
	}
	r.release <- struct{}{}
	require.NoError(t, testenv.WaitChan(t, gateDone, "gate"))
	testenv.WaitChan(t, r.entered, "the panicking round")
	r.release <- struct{}{}
	wg.Wait()
	// "ok" queued first, so it was handed the round and sent it.
	require.Equal(t, "boom", panics[0], "the sender's goroutine panics")
	require.Nil(t, panics[1])
	require.ErrorIs(t, errs[1], combine.ErrRoundPanicked, "the other caller is released with an error")

	r.hold.Store(false)
	q := &req{key: "after"}
	require.NoError(t, r.c.Do(t.Context(), q))
	require.Equal(t, int64(3), q.round)
}

// Many callers, some giving up at random: every Do returns, and every
// operation reported done was answered.
func TestCombiner_NoHangUnderConcurrency(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	const n = 500
	reqs := make([]*req, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range reqs {
		reqs[i] = &req{key: "x"}
		wg.Go(func() {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if i%4 == 0 {
				go cancel()
			}
			errs[i] = r.c.Do(ctx, reqs[i])
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	testenv.WaitChan(t, done, "every Do returned")
	answered := 0
	for i, q := range reqs {
		if errs[i] == nil {
			require.Positive(t, q.round, "request %d reported done", i)
			answered++
		}
	}
	require.GreaterOrEqual(t, answered, n*3/4)
	require.LessOrEqual(t, r.rounds.Load(), int64(answered))
	require.Zero(t, r.c.Queued())
}
