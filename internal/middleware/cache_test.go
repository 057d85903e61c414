package middleware_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/logtest"
	"github.com/inboxmq/inboxmq/internal/middleware"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// countingHandler returns a handler that counts its calls and returns err.
func countingHandler(calls *int, err error) inboxtype.DeliveryHandler {
	return func(context.Context, *inboxtype.Delivery) error {
		*calls++
		return err
	}
}

func TestCache_HitShortCircuits(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupRedis(t)
	mw := middleware.Cache(b.flaky, &middleware.CacheOpts{Prefix: b.prefix})
	require.NoError(t, b.rdb.Set(ctx, b.prefix+"svc:order-1", cacheValue(keyedDelivery("order-1")), time.Minute).Err())

	calls := 0
	err := mw(countingHandler(&calls, nil))(ctx, keyedDelivery("order-1"))
	require.Zero(t, calls, "a cached completion skips the handler")
	dec := retry.Classify(err)
	require.Equal(t, retry.KindDuplicate, dec.Kind)
	require.Equal(t, retry.SourceCache, dec.Source)
	require.Equal(t, int64(1), b.flaky.Calls.Load(), "one GET, no write")
}

func TestCache_MissRunsAndRecordsSuccess(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupRedis(t)
	mw := middleware.Cache(b.flaky, &middleware.CacheOpts{Prefix: b.prefix})
	key := b.prefix + "svc:order-2"

	calls := 0
	require.NoError(t, mw(countingHandler(&calls, nil))(ctx, keyedDelivery("order-2")))
	require.Equal(t, 1, calls)
	val, err := b.rdb.Get(ctx, key).Result()
	require.NoError(t, err)
	require.Equal(t, cacheValue(keyedDelivery("order-2")), val, "the entry is the job's fingerprint")
	ttl := b.rdb.PTTL(ctx, key).Val()
	require.Greater(t, ttl, 23*time.Hour, "default TTL is 24h")

	// The redelivery is caught by the cache.
	err = mw(countingHandler(&calls, nil))(ctx, keyedDelivery("order-2"))
	require.Equal(t, 1, calls)
	require.ErrorIs(t, err, retry.ErrDuplicate)
}

func TestCache_WritesOnlyAfterCompletion(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupRedis(t)
	mw := middleware.Cache(b.flaky, &middleware.CacheOpts{Prefix: b.prefix, TTL: time.Minute})

	tests := []struct {
		name   string
		err    error
		cached bool
	}{
		{name: "Success", err: nil, cached: true},
		{name: "InboxDuplicate", err: retry.Duplicate(retry.SourceInbox, nil), cached: true},
		{name: "BareDuplicate", err: retry.ErrDuplicate, cached: true},
		{name: "ClaimHeldElsewhere", err: retry.Duplicate(retry.SourceClaimHeld, nil), cached: false},
		{name: "FencedOut", err: retry.Duplicate(retry.SourceFenced, nil), cached: false},
		{name: "KeyConflict", err: retry.Permanent(retry.ErrKeyConflict), cached: false},
		{name: "BusinessConstraint", err: retry.Duplicate(retry.SourceBusiness, nil), cached: false},
		{name: "Retryable", err: retry.After(time.Second, errors.New("gateway 503")), cached: false},
		{name: "Permanent", err: retry.Permanent(errors.New("invalid")), cached: false},
		{name: "Unknown", err: errors.New("boom"), cached: false},
		{name: "Timeout", err: context.DeadlineExceeded, cached: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			calls := 0
			err := mw(countingHandler(&calls, tt.err))(ctx, keyedDelivery(tt.name))
			require.Equal(t, 1, calls)
			if tt.err == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tt.err, "the handler's result is returned unchanged")
			}
			n := b.rdb.Exists(ctx, b.prefix+"svc:"+tt.name).Val()
			if tt.cached {
				require.Equal(t, int64(1), n)
			} else {
				require.Equal(t, int64(0), n, "never written after a failure")
			}
		})
	}
}

func TestCache_WrongOrDeletedEntryNeverBlocks(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupRedis(t)
	mw := middleware.Cache(b.flaky, &middleware.CacheOpts{Prefix: b.prefix})
	key := b.prefix + "svc:order-3"

	// A foreign value is a miss; success overwrites it.
	require.NoError(t, b.rdb.Set(ctx, key, "processing", time.Minute).Err())
	calls := 0
	require.NoError(t, mw(countingHandler(&calls, nil))(ctx, keyedDelivery("order-3")))
	require.Equal(t, 1, calls)
	require.Equal(t, cacheValue(keyedDelivery("order-3")), b.rdb.Get(ctx, key).Val())

	// A deleted entry (eviction, FLUSHALL) sends the delivery to the inbox,
	// which has the final word.
	require.NoError(t, b.rdb.Del(ctx, key).Err())
	inboxSaysDone := retry.Duplicate(retry.SourceInbox, nil)
	err := mw(countingHandler(&calls, inboxSaysDone))(ctx, keyedDelivery("order-3"))
	require.Equal(t, 2, calls)
	require.Equal(t, retry.SourceInbox, retry.Classify(err).Source)
	require.Equal(t, cacheValue(keyedDelivery("order-3")), b.rdb.Get(ctx, key).Val(), "re-cached from the inbox's answer")
}

func TestCache_HitOnlyForTheSameFingerprint(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupRedis(t)
	mw := middleware.Cache(b.flaky, &middleware.CacheOpts{Prefix: b.prefix})
	job := func(fp string) *inboxtype.Delivery {
		d := keyedDelivery("order-x")
		d.Fingerprint = []byte(fp)
		return d
	}
	calls := 0
	require.NoError(t, mw(countingHandler(&calls, nil))(ctx, job("100 USD")), "the first job commits")

	// Another job reusing the key: the cache does not answer, the inbox
	// does (a key conflict), and the entry stays the first job's.
	conflict := retry.Permanent(retry.ErrKeyConflict)
	err := mw(countingHandler(&calls, conflict))(ctx, job("200 USD"))
	require.Equal(t, 2, calls, "a copy with another fingerprint reaches the inbox")
	require.ErrorIs(t, err, retry.ErrKeyConflict)
	err = mw(countingHandler(&calls, conflict))(ctx, job("200 USD"))
	require.Equal(t, 3, calls, "nothing was cached after the conflict")
	require.ErrorIs(t, err, retry.ErrKeyConflict)

	// A copy of the first job is still a cache hit.
	err = mw(countingHandler(&calls, nil))(ctx, job("100 USD"))
	require.Equal(t, 3, calls)
	require.Equal(t, retry.SourceCache, retry.Classify(err).Source)
}

func TestCache_OldOrForeignValueFallsThrough(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupRedis(t)
	mw := middleware.Cache(b.flaky, &middleware.CacheOpts{Prefix: b.prefix})
	key := b.prefix + "svc:order-old"
	for _, v := range []string{"completed", "", "zz"} {
		// "completed" is what earlier versions wrote: it says nothing about
		// which job completed.
		require.NoError(t, b.rdb.Set(ctx, key, v, time.Minute).Err())
		calls := 0
		inboxSaysDone := retry.Duplicate(retry.SourceInbox, nil)
		err := mw(countingHandler(&calls, inboxSaysDone))(ctx, keyedDelivery("order-old"))
		require.Equal(t, 1, calls, "value %q is not a hit", v)
		require.Equal(t, retry.SourceInbox, retry.Classify(err).Source)
	}
}

func TestCache_NoFingerprintPassesThrough(t *testing.T) {
	t.Parallel()
	b := setupRedis(t)
	mw := middleware.Cache(b.flaky, &middleware.CacheOpts{Prefix: b.prefix})
	d := keyedDelivery("order-nofp")
	d.Fingerprint = nil // a delivery that did not come through Register
	calls := 0
	require.NoError(t, mw(countingHandler(&calls, nil))(t.Context(), d))
	require.Equal(t, 1, calls)
	require.Zero(t, b.flaky.Calls.Load(), "the cache can neither answer nor be written without a fingerprint")
}

func TestCache_DegradedFallsThroughAndRecovers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupRedis(t)
	hook, events := degradedHook()
	logger, logs := logtest.New(slog.LevelInfo)
	mw := middleware.Cache(b.flaky, &middleware.CacheOpts{
		Prefix:        b.prefix,
		CallTimeout:   50 * time.Millisecond,
		ProbeInterval: -1,
		Logger:        logger,
		OnDegraded:    hook,
	})
	// The entry says completed, but Redis cannot be read: the delivery
	// goes on to the inbox.
	require.NoError(t, b.rdb.Set(ctx, b.prefix+"svc:k", cacheValue(keyedDelivery("k")), time.Minute).Err())

	calls := 0
	b.flaky.Fail.Store(true)
	require.NoError(t, mw(countingHandler(&calls, nil))(ctx, keyedDelivery("k")))
	require.Equal(t, 1, calls)
	b.flaky.Fail.Store(false)
	b.flaky.Hang.Store(true)
	require.NoError(t, mw(countingHandler(&calls, nil))(ctx, keyedDelivery("k")))
	require.Equal(t, 2, calls)
	require.True(t, testenv.WaitChan(t, events, "OnDegraded(true)"))

	b.flaky.Hang.Store(false)
	err := mw(countingHandler(&calls, nil))(ctx, keyedDelivery("k"))
	require.Equal(t, 2, calls)
	require.ErrorIs(t, err, retry.ErrDuplicate)
	require.False(t, testenv.WaitChan(t, events, "OnDegraded(false)"))
	require.Empty(t, events)
	require.Equal(t, 1, logs.Count("redis unavailable: proceeding without it"))
	require.Equal(t, 1, logs.Count("redis answers again"))
}

func TestCache_WritesAfterContextEnded(t *testing.T) {
	t.Parallel()
	b := setupRedis(t)
	mw := middleware.Cache(b.flaky, &middleware.CacheOpts{Prefix: b.prefix})
	cctx, cancel := context.WithCancel(t.Context())
	err := mw(func(context.Context, *inboxtype.Delivery) error {
		cancel() // the worker is stopping, but this delivery committed
		return nil
	})(cctx, keyedDelivery("k"))
	require.NoError(t, err)
	require.Equal(t, cacheValue(keyedDelivery("k")), b.rdb.Get(t.Context(), b.prefix+"svc:k").Val())
}

// A cache mounted where no key is set must not silently cache nothing:
// the delivery fails permanently, naming the misconfiguration.
func TestCache_NoKeyIsAPermanentMisconfiguration(t *testing.T) {
	t.Parallel()
	b := setupRedis(t)
	mw := middleware.Cache(b.flaky, nil)
	calls := 0
	err := mw(countingHandler(&calls, nil))(t.Context(), keyedDelivery(""))
	require.Error(t, err)
	require.Equal(t, retry.KindPermanent, retry.Classify(err).Kind)
	require.ErrorContains(t, err, "Cache got a delivery without an idempotency key")
	require.Zero(t, calls, "next does not run")
	require.Zero(t, b.flaky.Calls.Load())
	require.Panics(t, func() { middleware.Cache(nil, nil) })
}

// BenchmarkCacheMiddleware measures a first delivery through the cache
// (GET miss, handler, SET): two round trips.
func BenchmarkCacheMiddleware(b *testing.B) {
	rb := setupRedis(b)
	h := middleware.Cache(rb.flaky, &middleware.CacheOpts{Prefix: rb.prefix, TTL: time.Minute})(
		func(context.Context, *inboxtype.Delivery) error { return nil })
	b.ReportAllocs()
	runParallel8(b, func(i int64) error { return h(b.Context(), keyedDelivery("k"+itoa(i))) })
	b.ReportMetric(float64(rb.flaky.Calls.Load())/float64(b.N), "roundtrips/delivery")
}

// BenchmarkCacheMiddleware_OneAtATime is BenchmarkCacheMiddleware with
// one delivery at a time: every GET and SET is a round trip alone, as in
// a worker whose deliveries rarely overlap.
func BenchmarkCacheMiddleware_OneAtATime(b *testing.B) {
	rb := setupRedis(b)
	h := middleware.Cache(rb.flaky, &middleware.CacheOpts{Prefix: rb.prefix, TTL: time.Minute})(
		func(context.Context, *inboxtype.Delivery) error { return nil })
	b.ReportAllocs()
	var i int64
	for b.Loop() {
		i++
		if err := h(b.Context(), keyedDelivery("k"+itoa(i))); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rb.flaky.Calls.Load())/float64(b.N), "roundtrips/delivery")
}
