package middleware

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// ReasonRateLimited is the retry reason of a delivery that [RateLimit]
// deferred (without counting an attempt) because the next free slot was
// further away than it may wait. It is a bounded metric label.
const ReasonRateLimited = "rate_limited"

// Defaults of [RateLimitOpts].
const (
	DefaultRateLimitPrefix      = "inboxmq:ratelimit:"
	DefaultRateLimitMaxWait     = 2 * time.Second
	DefaultRateLimitCallTimeout = 100 * time.Millisecond
)

var (
	//go:embed ratelimit.lua
	rateLimitSrc    string
	rateLimitScript = redis.NewScript(rateLimitSrc)
)

// RateLimitOpts configure [RateLimit]. Rate is required; a value out of
// range makes RateLimit return an error.
type RateLimitOpts struct {
	// Downstream names what is limited (a gateway, a merchant account):
	// every worker and route that limits the same Downstream shares one
	// limit. Defaults to "default".
	Downstream string
	// Rate is the number of calls per second allowed across all workers.
	// Required (above 0).
	Rate float64
	// Burst is how many calls may run at once after a quiet spell; over
	// any span of time T the downstream sees at most Rate×T + Burst
	// calls. Defaults to 1 (calls evenly spaced).
	Burst int
	// ExpectedWorkers is the number of worker processes sharing the limit.
	// While Redis does not answer, each worker limits itself to
	// Rate / ExpectedWorkers (and Burst / ExpectedWorkers, at least 1),
	// so the downstream still sees about Rate. Defaults to 1: each worker
	// alone keeps to the whole Rate, which with several workers lets the
	// downstream see a multiple of it while Redis is down.
	ExpectedWorkers int
	// MaxWait is the longest a delivery waits for its slot. A delivery
	// whose slot is further away is deferred (retry.Defer, reason
	// [ReasonRateLimited]: not counted as an attempt) until about then.
	// The wait is also kept within half of what is left of the delivery's
	// deadline (Config.HandlerTimeout), so that waiting never makes a
	// handler time out. Defaults to DefaultRateLimitMaxWait (2s).
	MaxWait time.Duration
	// Prefix starts the limiter's Redis key, "<Prefix>{<Downstream>}" (one
	// key per downstream, hash-tagged for Redis Cluster). Defaults to
	// DefaultRateLimitPrefix ("inboxmq:ratelimit:").
	Prefix string
	// CallTimeout bounds each Redis call; past it the worker uses its own
	// share of the limit. Build the client with ContextTimeoutEnabled so
	// the bound covers socket reads. Defaults to
	// DefaultRateLimitCallTimeout (100ms).
	CallTimeout time.Duration
	// ProbeInterval: while Redis is degraded it is tried at most once per
	// ProbeInterval; other deliveries use the worker's share at once.
	// Defaults to 1s.
	ProbeInterval time.Duration
	// Logger logs each change between Redis answering and not (once per
	// change). Defaults to nil, which discards the lines.
	Logger *slog.Logger
	// OnDegraded is called on each such change: true when the worker falls
	// back to its share, false when Redis answers again. It is called
	// synchronously; keep it fast. Defaults to nothing.
	OnDegraded func(degraded bool)
	// OnWait is called for each delivery that took a slot, with how long it
	// has to wait for it (0 when the limit is not biting), before it
	// waits. Deferred deliveries are not reported (they count in the
	// retries, reason rate_limited). It is called synchronously; keep it
	// fast. Defaults to nothing.
	OnWait func(wait time.Duration)
}

func (o *RateLimitOpts) withDefaults() RateLimitOpts {
	var out RateLimitOpts
	if o != nil {
		out = *o
	}
	if out.Downstream == "" {
		out.Downstream = "default"
	}
	if out.Burst == 0 {
		out.Burst = 1
	}
	if out.ExpectedWorkers == 0 {
		out.ExpectedWorkers = 1
	}
	if out.MaxWait == 0 {
		out.MaxWait = DefaultRateLimitMaxWait
	}
	if out.Prefix == "" {
		out.Prefix = DefaultRateLimitPrefix
	}
	if out.CallTimeout == 0 {
		out.CallTimeout = DefaultRateLimitCallTimeout
	}
	if out.ProbeInterval == 0 {
		out.ProbeInterval = time.Second
	}
	return out
}

func (o RateLimitOpts) validate() error {
	switch {
	case o.Rate <= 0:
		return fmt.Errorf("middleware: RateLimit %q: Rate %g: want calls per second above 0", o.Downstream, o.Rate)
	case o.Burst < 1:
		return fmt.Errorf("middleware: RateLimit %q: Burst %d: want at least 1", o.Downstream, o.Burst)
	case o.ExpectedWorkers < 1:
		return fmt.Errorf("middleware: RateLimit %q: ExpectedWorkers %d: want at least 1", o.Downstream, o.ExpectedWorkers)
	case o.MaxWait < 0:
		return fmt.Errorf("middleware: RateLimit %q: MaxWait %s: want a positive duration", o.Downstream, o.MaxWait)
	case o.CallTimeout < 0:
		return fmt.Errorf("middleware: RateLimit %q: CallTimeout %s: want a positive duration", o.Downstream, o.CallTimeout)
	case o.ProbeInterval < -1:
		return fmt.Errorf("middleware: RateLimit %q: ProbeInterval %s: want a positive duration, or -1", o.Downstream, o.ProbeInterval)
	}
	return nil
}

// RateLimit returns handler middleware that keeps the calls to a
// downstream within a rate shared by every worker: each delivery takes the
// next free slot of a GCRA limiter kept in Redis (one round trip, one key
// per downstream), waits for it (bounded, see RateLimitOpts.MaxWait), and
// only then runs the rest of the chain. A delivery whose slot is too far
// away is deferred without counting an attempt, so a limit never
// dead-letters anything.
//
// Mount it in HandlerOpts.Middleware, after the lock (a delivery whose key
// another worker holds takes no slot) and around the code that calls the
// downstream. Each delivery that reaches it counts as one call, whether
// the handler then calls the downstream or finds the job already done.
//
// Redis only coordinates the workers: with Redis down or slow (an error,
// or no answer within CallTimeout), each worker keeps to its own share of
// the limit, Rate / ExpectedWorkers, in memory — never unlimited — and
// goes back to the shared limit when Redis answers. A nil client means the
// worker's share only.
func RateLimit(client redis.UniversalClient, opts *RateLimitOpts) (inboxtype.Middleware, error) {
	o := opts.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	share := o.Rate / float64(o.ExpectedWorkers)
	m := &rateLimiter{
		opts:     o,
		client:   client,
		key:      o.Prefix + "{" + o.Downstream + "}",
		interval: time.Duration(float64(time.Second) / o.Rate),
		local:    rate.NewLimiter(rate.Limit(share), max(1, o.Burst/o.ExpectedWorkers)),
		health:   newHealth("ratelimit", o.ProbeInterval, o.Logger, o.OnDegraded),
	}
	return m.wrap, nil
}

type rateLimiter struct {
	opts     RateLimitOpts
	client   redis.UniversalClient
	key      string
	interval time.Duration
	local    *rate.Limiter
	health   *health
}

func (m *rateLimiter) wrap(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
	return func(ctx context.Context, d *inboxtype.Delivery) error {
		maxWait := m.opts.MaxWait
		if deadline, ok := ctx.Deadline(); ok {
			maxWait = min(maxWait, time.Until(deadline)/2)
		}
		wait, ok, err := m.reserve(ctx, max(maxWait, 0))
		if err != nil {
			return err
		}
		if !ok {
			return retry.WithReason(ReasonRateLimited, retry.Defer(wait,
				fmt.Errorf("middleware: rate limit of %q: next slot in %s", m.opts.Downstream, wait.Round(time.Millisecond))))
		}
		if m.opts.OnWait != nil {
			m.opts.OnWait(wait)
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return errors.Join(fmt.Errorf("middleware: rate limit of %q: waiting for a slot", m.opts.Downstream), ctx.Err())
			}
		}
		return next(ctx, d)
	}
}

// reserve takes a slot within maxWait and returns how long to wait for it,
// or ok=false and the wait it would have needed. It uses Redis when it
// answers and the worker's share otherwise; err is only ctx's.
func (m *rateLimiter) reserve(ctx context.Context, maxWait time.Duration) (time.Duration, bool, error) {
	if m.client != nil && m.health.allow() {
		cctx, cancel := context.WithTimeout(ctx, m.opts.CallTimeout)
		wait, ok, err := m.reserveShared(cctx, maxWait)
		cancel()
		switch {
		case err == nil:
			m.health.set(false, nil)
			return wait, ok, nil
		case ctx.Err() != nil:
			return 0, false, fmt.Errorf("middleware: rate limit of %q: %w", m.opts.Downstream, ctx.Err())
		default:
			m.health.set(true, err)
		}
	}
	now := time.Now()
	r := m.local.ReserveN(now, 1)
	wait := r.DelayFrom(now)
	if !r.OK() || wait > maxWait {
		r.CancelAt(now)
		return max(wait, m.interval), false, nil
	}
	return wait, true, nil
}

func (m *rateLimiter) reserveShared(ctx context.Context, maxWait time.Duration) (time.Duration, bool, error) {
	interval := m.interval.Microseconds()
	res, err := rateLimitScript.Run(ctx, m.client, []string{m.key},
		max(interval, 1), interval*int64(m.opts.Burst-1), maxWait.Microseconds()).Slice()
	if err != nil {
		return 0, false, fmt.Errorf("middleware: rate limit script: %w", err)
	}
	if len(res) != 2 {
		return 0, false, fmt.Errorf("middleware: rate limit script: unexpected reply %v", res)
	}
	reserved, _ := res[0].(int64)
	text, _ := res[1].(string)
	us, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("middleware: rate limit script: wait %q: %w", text, err)
	}
	return time.Duration(us) * time.Microsecond, reserved == 1, nil
}
