package middleware_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/lock"
	"github.com/inboxmq/inboxmq/internal/logtest"
	"github.com/inboxmq/inboxmq/internal/middleware"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// mustLock is middleware.Lock for options that are valid.
func mustLock(tb testing.TB, client redis.UniversalClient, opts *middleware.LockOpts) inboxtype.Middleware {
	tb.Helper()
	mw, err := middleware.Lock(client, opts)
	require.NoError(tb, err)
	return mw
}

// redisLockKey is the Redis key of the middleware's lock on key for
// consumer "svc".
func redisLockKey(prefix, key string) string {
	k, _ := lock.RedisKeys(prefix + "svc:" + key)
	return k
}

func TestLock_AcquiredRunsNextAndReleases(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupRedis(t)
	rec := &transitionRecorder{}
	d := keyedDelivery("order-1", rec)
	mw := mustLock(t, b.flaky, &middleware.LockOpts{Prefix: b.prefix})

	calls := 0
	err := mw(func(ctx context.Context, d *inboxtype.Delivery) error {
		calls++
		require.Equal(t, middleware.LockAcquired, d.LockResult)
		require.Equal(t, b.prefix+"svc:order-1", d.LockKey)
		require.Positive(t, d.LockFence)
		ttl, err := b.rdb.PTTL(ctx, redisLockKey(b.prefix, "order-1")).Result()
		require.NoError(t, err)
		require.Greater(t, ttl, 4*time.Second, "the obtain sets a 5s lease")
		require.LessOrEqual(t, ttl, 5*time.Second, "the keep-alive extends it to the 30s TTL")
		require.NoError(t, ctx.Err())
		return nil
	})(ctx, d)
	require.NoError(t, err)
	require.Equal(t, 1, calls)
	require.Equal(t, []inboxtype.Status{inboxtype.StatusLocked}, rec.statuses())
	require.Equal(t, int64(0), b.rdb.Exists(ctx, redisLockKey(b.prefix, "order-1")).Val(), "released")
	require.Equal(t, int64(2), b.flaky.Calls.Load(), "two round trips: obtain and release")

	// The next holder gets a larger fence.
	first := d.LockFence
	d2 := keyedDelivery("order-1")
	require.NoError(t, mw(func(context.Context, *inboxtype.Delivery) error { return nil })(ctx, d2))
	require.Greater(t, d2.LockFence, first)
}

func TestLock_HandlerErrorPassesThrough(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupRedis(t)
	mw := mustLock(t, b.flaky, &middleware.LockOpts{Prefix: b.prefix})

	boom := retry.Permanent(errors.New("boom"))
	err := mw(func(context.Context, *inboxtype.Delivery) error { return boom })(ctx, keyedDelivery("k"))
	require.ErrorIs(t, err, boom)
	require.Equal(t, int64(0), b.rdb.Exists(ctx, redisLockKey(b.prefix, "k")).Val(), "released after a failure too")
}

func TestLock_ConcurrentSameKey(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupRedis(t)
	mw := mustLock(t, b.flaky, &middleware.LockOpts{Prefix: b.prefix, RetryDelay: 3 * time.Second})

	entered := make(chan struct{})
	release := make(chan struct{})
	firstDone := make(chan error, 1)
	go func() {
		firstDone <- mw(func(context.Context, *inboxtype.Delivery) error {
			close(entered)
			<-release
			return nil
		})(ctx, keyedDelivery("order-2"))
	}()
	testenv.WaitChan(t, entered, "first delivery to hold the lock")

	rec := &transitionRecorder{}
	d := keyedDelivery("order-2", rec)
	called := false
	err := mw(func(context.Context, *inboxtype.Delivery) error {
		called = true
		return nil
	})(ctx, d)
	close(release)
	require.NoError(t, testenv.WaitChan(t, firstDone, "first delivery to finish"))

	require.False(t, called, "only one run of next per key at a time")
	require.Equal(t, middleware.LockHeld, d.LockResult)
	dec := retry.Classify(err)
	require.Equal(t, retry.KindRetry, dec.Kind)
	require.Equal(t, 3*time.Second, dec.Delay, "no hot requeue loop")
	require.Equal(t, middleware.ReasonLockUnavailable, dec.Reason)
	require.True(t, dec.Uncounted, "waiting for another holder is not a failed attempt")
	require.ErrorIs(t, err, lock.ErrNotObtained)
	require.Equal(t, []inboxtype.Status{inboxtype.StatusLockFailed}, rec.statuses())
}

// A delivery that finds its key held waits no longer than the holder's
// lock lives: a holder that died frees the key when its TTL runs out.
func TestLock_DeferralFollowsHolderTTL(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupRedis(t)
	mw := mustLock(t, b.flaky, &middleware.LockOpts{Prefix: b.prefix, RetryDelay: 10 * time.Second})
	_, err := lock.Obtain(ctx, b.rdb, b.prefix+"svc:dead-holder", 2*time.Second, 0) // never released
	require.NoError(t, err)

	d := keyedDelivery("dead-holder")
	err = mw(func(context.Context, *inboxtype.Delivery) error { return nil })(ctx, d)
	require.Equal(t, middleware.LockHeld, d.LockResult)
	dec := retry.Classify(err)
	require.True(t, dec.Uncounted)
	require.Greater(t, dec.Delay, time.Second, "about the holder's remaining TTL")
	require.LessOrEqual(t, dec.Delay, 2*time.Second, "not RetryDelay (10s): the lock runs out before")
}

// A delivery deferred again waits twice as long as it last waited, and
// never past the holder's TTL (MaxLockTTL for a key without one). What it
// last waited comes from the headers the consumer writes on a retry copy
// (x-error with the reason, x-last-failed-at); foreign values cannot push
// it out of range.
func TestLock_RepeatedDeferralGrows(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupRedis(t)
	mw := mustLock(t, b.flaky, &middleware.LockOpts{Prefix: b.prefix, RetryDelay: time.Second})

	// Headers are built when each case runs, so the time since the last
	// deferral is what the case says.
	deferred := func(ago time.Duration) func() amqp.Table {
		return func() amqp.Table {
			return amqp.Table{
				inboxtype.HeaderError:        middleware.ReasonLockUnavailable + `: middleware: lock "x" is held by another worker`,
				inboxtype.HeaderLastFailedAt: time.Now().Add(-ago).UTC().Format(time.RFC3339Nano),
			}
		}
	}
	table := func(h amqp.Table) func() amqp.Table { return func() amqp.Table { return h } }
	tests := []struct {
		name     string
		holder   time.Duration // the holder's TTL; 0: a key without expiry
		headers  func() amqp.Table
		min, max time.Duration
	}{
		{name: "First", holder: time.Minute, headers: table(nil), min: time.Second, max: time.Second},
		{name: "Second", holder: time.Minute, headers: deferred(time.Second), min: 2 * time.Second, max: 3 * time.Second},
		{name: "Later", holder: time.Minute, headers: deferred(5 * time.Second), min: 10 * time.Second, max: 11 * time.Second},
		{name: "CappedByTheHolder", holder: time.Minute, headers: deferred(time.Hour), min: 50 * time.Second, max: time.Minute},
		{name: "KeyWithoutExpiry", holder: 0, headers: deferred(time.Hour), min: middleware.MaxLockTTL, max: middleware.MaxLockTTL},
		{name: "HolderExpiresFirst", holder: 3 * time.Second, headers: deferred(5 * time.Second), min: 1500 * time.Millisecond, max: 3 * time.Second},
		{name: "AfterAnotherFailure", holder: time.Minute, headers: table(amqp.Table{
			inboxtype.HeaderError:        "db_connection: conn refused",
			inboxtype.HeaderLastFailedAt: time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano),
		}), min: time.Second, max: time.Second},
		{name: "FutureTime", holder: time.Minute, headers: deferred(-time.Hour), min: time.Second, max: time.Second},
		{name: "Garbage", holder: time.Minute, headers: table(amqp.Table{
			inboxtype.HeaderError:        middleware.ReasonLockUnavailable + ": x",
			inboxtype.HeaderLastFailedAt: int32(7),
		}), min: time.Second, max: time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// Each case has a holder of its own, obtained now.
			if tt.holder == 0 {
				require.NoError(t, b.rdb.Set(ctx, redisLockKey(b.prefix, tt.name), "foreign", 0).Err())
			} else {
				_, err := lock.Obtain(ctx, b.rdb, b.prefix+"svc:"+tt.name, tt.holder, 0)
				require.NoError(t, err)
			}
			d := keyedDelivery(tt.name)
			d.Headers = tt.headers()
			err := mw(func(context.Context, *inboxtype.Delivery) error { return nil })(ctx, d)
			require.Equal(t, middleware.LockHeld, d.LockResult)
			delay := retry.Classify(err).Delay
			require.GreaterOrEqual(t, delay, tt.min)
			require.LessOrEqual(t, delay, tt.max)
		})
	}
}

// LockOpts out of range are refused with an error that names the option,
// never silently replaced.
func TestLock_OptionsOutOfRange(t *testing.T) {
	t.Parallel()
	b := setupRedis(t)
	tests := []struct {
		name    string
		opts    *middleware.LockOpts
		wantErr string
	}{
		{name: "Defaults", opts: nil},
		{name: "MinTTL", opts: &middleware.LockOpts{TTL: middleware.MinLockTTL}},
		{name: "MaxTTL", opts: &middleware.LockOpts{TTL: middleware.MaxLockTTL}},
		{name: "TTL1ns", opts: &middleware.LockOpts{TTL: time.Nanosecond}, wantErr: "TTL 1ns is out of range: want 1s to 10m0s"},
		{name: "TTL1ms", opts: &middleware.LockOpts{TTL: time.Millisecond}, wantErr: "TTL 1ms is out of range"},
		{name: "TTL1h", opts: &middleware.LockOpts{TTL: time.Hour}, wantErr: "TTL 1h0m0s is out of range"},
		{name: "NegativeTTL", opts: &middleware.LockOpts{TTL: -time.Second}, wantErr: "TTL -1s is out of range"},
		{name: "MaxHold", opts: &middleware.LockOpts{MaxHold: -2}, wantErr: "MaxHold"},
		{name: "RetryDelay", opts: &middleware.LockOpts{RetryDelay: -time.Second}, wantErr: "RetryDelay"},
		{name: "CallTimeout", opts: &middleware.LockOpts{TTL: time.Second, CallTimeout: 400 * time.Millisecond}, wantErr: "CallTimeout 400ms"},
		{name: "ProbeInterval", opts: &middleware.LockOpts{ProbeInterval: -2}, wantErr: "ProbeInterval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			mw, err := middleware.Lock(b.rdb, tt.opts)
			if tt.wantErr == "" {
				require.NoError(t, err)
				require.NotNil(t, mw)
				return
			}
			require.ErrorContains(t, err, "middleware: Lock: "+tt.wantErr)
			require.Nil(t, mw)
		})
	}
}

func TestLock_LostBeforeCompletion(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupRedis(t)
	// Refreshes every 333ms.
	mw := mustLock(t, b.flaky, &middleware.LockOpts{Prefix: b.prefix, TTL: time.Second})

	t.Run("HandlerFails", func(t *testing.T) {
		t.Parallel()
		rec := &transitionRecorder{}
		err := mw(func(ctx context.Context, d *inboxtype.Delivery) error {
			require.NoError(t, b.rdb.Del(ctx, redisLockKey(b.prefix, "lost-1")).Err())
			testenv.WaitChan(t, ctx.Done(), "handler context to be cancelled")
			require.ErrorIs(t, context.Cause(ctx), lock.ErrLockLost)
			return ctx.Err()
		})(ctx, keyedDelivery("lost-1", rec))
		dec := retry.Classify(err)
		require.Equal(t, retry.KindRetry, dec.Kind)
		require.Equal(t, middleware.ReasonLockExpired, dec.Reason)
		require.ErrorIs(t, err, lock.ErrLockLost)
		require.Equal(t, []inboxtype.Status{inboxtype.StatusLocked, inboxtype.StatusLockExpired}, rec.statuses())
		require.ErrorIs(t, rec.got[1].err, lock.ErrLockLost)
	})
	t.Run("HandlerCommittedAnyway", func(t *testing.T) {
		t.Parallel()
		rec := &transitionRecorder{}
		err := mw(func(ctx context.Context, d *inboxtype.Delivery) error {
			require.NoError(t, b.rdb.Del(ctx, redisLockKey(b.prefix, "lost-2")).Err())
			testenv.WaitChan(t, ctx.Done(), "handler context to be cancelled")
			return nil // the commit won the race: the effect is done
		})(ctx, keyedDelivery("lost-2", rec))
		require.NoError(t, err)
		require.Equal(t, []inboxtype.Status{inboxtype.StatusLocked, inboxtype.StatusLockExpired}, rec.statuses())
	})
	t.Run("ThiefKeepsItsLock", func(t *testing.T) {
		t.Parallel()
		var thief *lock.Lock
		err := mw(func(ctx context.Context, d *inboxtype.Delivery) error {
			require.NoError(t, b.rdb.Del(ctx, redisLockKey(b.prefix, "lost-3")).Err())
			var oerr error
			thief, oerr = lock.Obtain(ctx, b.rdb, b.prefix+"svc:lost-3", time.Minute, 0)
			require.NoError(t, oerr)
			require.Greater(t, thief.Fence(), d.LockFence)
			testenv.WaitChan(t, ctx.Done(), "handler context to be cancelled")
			return ctx.Err()
		})(ctx, keyedDelivery("lost-3"))
		require.Equal(t, middleware.ReasonLockExpired, retry.Classify(err).Reason)
		// The middleware's release did not delete the new holder's lock.
		require.NoError(t, thief.Release(ctx))
	})
}

func TestLock_MaxHold(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupRedis(t)
	mw := mustLock(t, b.flaky, &middleware.LockOpts{Prefix: b.prefix, TTL: time.Second, MaxHold: 200 * time.Millisecond})

	rec := &transitionRecorder{}
	err := mw(func(ctx context.Context, d *inboxtype.Delivery) error {
		testenv.WaitChan(t, ctx.Done(), "handler context to be cancelled at MaxHold")
		return ctx.Err()
	})(ctx, keyedDelivery("slow", rec))
	require.ErrorIs(t, err, lock.ErrMaxHoldReached)
	require.Equal(t, middleware.ReasonLockExpired, retry.Classify(err).Reason)
	require.Equal(t, []inboxtype.Status{inboxtype.StatusLocked, inboxtype.StatusLockExpired}, rec.statuses())
	require.Equal(t, int64(0), b.rdb.Exists(ctx, redisLockKey(b.prefix, "slow")).Val(), "released at the cap")
}

func TestLock_DegradedProceedsAndRecovers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupRedis(t)
	hook, events := degradedHook()
	logger, logs := logtest.New(slog.LevelInfo)
	mw := mustLock(t, b.flaky, &middleware.LockOpts{
		Prefix:        b.prefix,
		CallTimeout:   50 * time.Millisecond,
		ProbeInterval: -1,
		Logger:        logger,
		OnDegraded:    hook,
	})
	run := func(key string) (*inboxtype.Delivery, int, error) {
		d := keyedDelivery(key)
		calls := 0
		err := mw(func(context.Context, *inboxtype.Delivery) error {
			calls++
			return nil
		})(ctx, d)
		return d, calls, err
	}

	// Redis refuses connections: every delivery proceeds without the lock,
	// and the change is reported once.
	b.flaky.Fail.Store(true)
	for range 3 {
		d, calls, err := run("k")
		require.NoError(t, err)
		require.Equal(t, 1, calls)
		require.Equal(t, middleware.LockDegraded, d.LockResult)
		require.Zero(t, d.LockFence)
	}
	// Redis hangs: the call timeout ends the wait.
	b.flaky.Fail.Store(false)
	b.flaky.Hang.Store(true)
	d, calls, err := run("k")
	require.NoError(t, err)
	require.Equal(t, 1, calls)
	require.Equal(t, middleware.LockDegraded, d.LockResult)

	// Redis answers again: the lock is back (a slow machine may need more
	// than one call timeout for the first answer).
	b.flaky.Hang.Store(false)
	testenv.WaitFor(t, "the lock is obtained again once Redis answers", func() bool {
		d, calls, err := run("k")
		require.NoError(t, err)
		require.Equal(t, 1, calls)
		return d.LockResult == middleware.LockAcquired
	})

	require.True(t, testenv.WaitChan(t, events, "OnDegraded(true)"))
	require.False(t, testenv.WaitChan(t, events, "OnDegraded(false)"))
	require.Empty(t, events, "one call per change")
	require.Equal(t, 1, logs.Count("redis unavailable: proceeding without it"))
	require.Equal(t, 1, logs.Count("redis answers again"))
}

func TestLock_DegradedProbesOncePerInterval(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupRedis(t)
	mw := mustLock(t, b.flaky, &middleware.LockOpts{Prefix: b.prefix, ProbeInterval: time.Hour})

	b.flaky.Fail.Store(true)
	for range 5 {
		d := keyedDelivery("k")
		require.NoError(t, mw(func(context.Context, *inboxtype.Delivery) error { return nil })(ctx, d))
		require.Equal(t, middleware.LockDegraded, d.LockResult)
	}
	require.Equal(t, int64(1), b.flaky.Calls.Load(), "while degraded, deliveries skip Redis until the next probe")
}

func TestLock_ContextEndedIsNotDegraded(t *testing.T) {
	t.Parallel()
	b := setupRedis(t)
	hook, events := degradedHook()
	mw := mustLock(t, b.flaky, &middleware.LockOpts{Prefix: b.prefix, OnDegraded: hook})

	cctx, cancel := context.WithCancel(t.Context())
	cancel()
	called := false
	err := mw(func(context.Context, *inboxtype.Delivery) error {
		called = true
		return nil
	})(cctx, keyedDelivery("k"))
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, called)
	require.Empty(t, events)
}

// A lock mounted where no key is set must not silently lock nothing: the
// delivery fails permanently, naming the misconfiguration.
func TestLock_NoKeyIsAPermanentMisconfiguration(t *testing.T) {
	t.Parallel()
	b := setupRedis(t)
	mw := mustLock(t, b.flaky, nil)
	d := keyedDelivery("")
	called := false
	err := mw(func(context.Context, *inboxtype.Delivery) error { called = true; return nil })(t.Context(), d)
	require.Error(t, err)
	require.Equal(t, retry.KindPermanent, retry.Classify(err).Kind)
	require.ErrorContains(t, err, "Lock got a delivery without an idempotency key")
	require.ErrorContains(t, err, "HandlerOpts.Middleware")
	require.False(t, called, "next does not run")
	require.Empty(t, d.LockResult)
	require.Zero(t, b.flaky.Calls.Load())
	_, err = middleware.Lock(nil, nil)
	require.ErrorContains(t, err, "nil redis client")
}

func TestLock_Span(t *testing.T) {
	t.Parallel()
	b := setupRedis(t)
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	mw := mustLock(t, b.flaky, &middleware.LockOpts{Prefix: b.prefix})

	ctx, parent := tp.Tracer("test").Start(t.Context(), "deliver")
	require.NoError(t, mw(func(context.Context, *inboxtype.Delivery) error { return nil })(ctx, keyedDelivery("k")))
	parent.End()

	spans := sr.Ended()
	require.Len(t, spans, 2)
	acquire := spans[0]
	require.Equal(t, "lock.acquire", acquire.Name())
	require.Equal(t, parent.SpanContext().SpanID(), acquire.Parent().SpanID())
	require.Equal(t, "github.com/inboxmq/inboxmq/internal/middleware", acquire.InstrumentationScope().Name)
	attrs := map[string]string{}
	for _, kv := range acquire.Attributes() {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	require.Equal(t, middleware.LockAcquired, attrs["inboxmq.lock.result"])
	require.Equal(t, b.prefix+"svc:k", attrs["inboxmq.lock.key"])
}

// BenchmarkLockMiddleware compares a delivery through the lock middleware
// (distinct keys, 8 goroutines, as a consumer with Concurrency 8 sees them)
// with the bare handler.
func BenchmarkLockMiddleware(b *testing.B) {
	noop := func(context.Context, *inboxtype.Delivery) error { return nil }
	b.Run("None", func(b *testing.B) {
		h := inboxtype.DeliveryHandler(noop)
		runParallel8(b, func(i int64) error { return h(b.Context(), keyedDelivery("k")) })
	})
	b.Run("Lock", func(b *testing.B) {
		rb := setupRedis(b)
		h := mustLock(b, rb.flaky, &middleware.LockOpts{Prefix: rb.prefix})(noop)
		runParallel8(b, func(i int64) error {
			return h(b.Context(), keyedDelivery("k"+itoa(i)))
		})
		b.ReportMetric(float64(rb.flaky.Calls.Load())/float64(b.N), "roundtrips/delivery")
	})
}
