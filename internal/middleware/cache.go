package middleware

import (
	"context"
	"encoding/hex"
	"errors"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// CacheOpts configure [Cache]. A nil *CacheOpts means defaults.
type CacheOpts struct {
	// Prefix starts every cache key: "<Prefix><consumer>:<idempotency key>".
	// Defaults to "inboxmq:done:".
	Prefix string
	// TTL is how long a completed entry is kept. Past it, a duplicate is
	// still caught by the inbox, only more slowly. Defaults to 24h.
	TTL time.Duration
	// CallTimeout bounds each delivery's wait for a read (GET) and for a
	// write (SET), a shared round trip included. Past it the delivery
	// goes on without the cache. Build the client with
	// ContextTimeoutEnabled so the bound covers socket reads. Defaults to
	// 150ms.
	CallTimeout time.Duration
	// ProbeInterval: while Redis is degraded, it is tried at most once per
	// ProbeInterval; other deliveries skip the cache at once. Defaults to 1s;
	// -1 tries Redis on every delivery.
	ProbeInterval time.Duration
	// Logger logs each change between healthy and degraded. Defaults to no
	// logging.
	Logger *slog.Logger
	// OnDegraded is called on each change between healthy and degraded
	// (true when Redis stopped answering, false when it answers again),
	// synchronously and once per change. Defaults to nothing.
	OnDegraded func(degraded bool)
}

func (o *CacheOpts) withDefaults() CacheOpts {
	var out CacheOpts
	if o != nil {
		out = *o
	}
	if out.Prefix == "" {
		out.Prefix = "inboxmq:done:"
	}
	if out.TTL < time.Millisecond {
		out.TTL = 24 * time.Hour
	}
	if out.CallTimeout <= 0 {
		out.CallTimeout = 150 * time.Millisecond
	}
	if out.ProbeInterval == 0 || out.ProbeInterval < -1 {
		out.ProbeInterval = time.Second
	}
	return out
}

// Cache returns a handler middleware that keeps a cache of completed
// idempotency keys in Redis: a fast path in front of the inbox. It belongs
// in HandlerOpts.Middleware (after decoding, so Delivery.Key and
// Delivery.Fingerprint are set). A delivery without a key means the cache
// is mounted where no key is set (router-wide, or on a route whose payload
// does not implement inboxtype.Keyer): it fails permanently, with an error
// that says so, and next is not called. A delivery with a key but no
// fingerprint passes through.
//
// The cache holds positive entries only, each the fingerprint of the job
// that completed, so it can say "this very job is completed" but never
// "not done", nor judge another job reusing the key:
//
//   - before next, it reads "<Prefix><consumer>:<key>"; a value equal to
//     the delivery's fingerprint (hex-encoded) returns
//     retry.Duplicate(retry.SourceCache, nil) without calling next (the
//     consumer acks it);
//   - a miss, any other value (another job's fingerprint, the "completed"
//     of earlier versions) and any Redis error or timeout fall through to
//     next: the inbox decides, and dead-letters a key conflict;
//   - after next returns nil (committed) or an inbox duplicate
//     (retry.ErrDuplicate from source inbox, which the inbox reports only
//     for the fingerprint it recorded), it writes the entry with TTL. It
//     never writes after a failure or a key conflict, nor after a
//     duplicate from another source (a live claim of another worker is not
//     a completion).
//
// Redis errors and timeouts are reported through OnDegraded and the logger
// once per change; the middleware recovers by itself. Cache panics if
// client is nil.
//
// The reads of concurrent deliveries share round trips, and so do their
// writes: a read (or write) that finds none under way is sent at once,
// alone; those that arrive meanwhile go out together in the next
// pipeline (a plain one, no MULTI, so it suits a Redis Cluster). Each
// delivery still gets its own answer, within its own CallTimeout; a round
// ends by the earliest deadline among its deliveries.
func Cache(client redis.UniversalClient, opts *CacheOpts) inboxtype.Middleware {
	if client == nil {
		panic("middleware: Cache: nil redis client")
	}
	return newCache(client, opts).wrap
}

func newCache(client redis.UniversalClient, opts *CacheOpts) *cacheMiddleware {
	o := opts.withDefaults()
	return &cacheMiddleware{
		opts:   o,
		rounds: newCacheRounds(client, o.TTL),
		health: newHealth("cache", o.ProbeInterval, o.Logger, o.OnDegraded),
	}
}

type cacheMiddleware struct {
	opts   CacheOpts
	rounds *cacheRounds // the GETs and SETs, in shared round trips
	health *health
}

func (m *cacheMiddleware) wrap(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
	return func(ctx context.Context, d *inboxtype.Delivery) error {
		if d.Key == "" {
			return errNoKey("Cache")
		}
		if len(d.Fingerprint) == 0 {
			return next(ctx, d)
		}
		key := m.opts.Prefix + d.Namespace + ":" + d.Key
		fp := hex.EncodeToString(d.Fingerprint)
		if m.health.allow() {
			// Bounded by CallTimeout as if ctx had that deadline, without a
			// context (and a timer) per call.
			val, err := m.rounds.get(ctx, time.Now().Add(m.opts.CallTimeout), key)
			switch {
			case err == nil:
				m.health.set(false, nil)
				if val == fp {
					return retry.Duplicate(retry.SourceCache, nil)
				}
			case errors.Is(err, redis.Nil):
				m.health.set(false, nil)
			case ctx.Err() != nil:
				// The delivery's context ended; not a Redis fault.
			default:
				m.health.set(true, err)
			}
		}

		err := next(ctx, d)
		if completed(err) && m.health.allow() {
			// Written even if ctx has ended: the effect is committed. The
			// round runs on a context of its own (roundContext): ctx's
			// values never reached the client.
			serr := m.rounds.set(context.Background(), time.Now().Add(m.opts.CallTimeout), key, fp)
			m.health.set(serr != nil, serr)
		}
		return err
	}
}

// completed reports whether err says the delivery's own job is committed:
// nil, or a duplicate caught by the inbox (never a key conflict).
func completed(err error) bool {
	if err == nil {
		return true
	}
	if !errors.Is(err, retry.ErrDuplicate) || errors.Is(err, retry.ErrKeyConflict) {
		return false
	}
	var dup *retry.DuplicateError
	if errors.As(err, &dup) {
		return dup.Source == retry.SourceInbox
	}
	return true // the bare sentinel, which the classifier attributes to the inbox
}
