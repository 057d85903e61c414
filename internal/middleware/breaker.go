package middleware

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// BreakerState is the state of a [Breaker]. Its numeric values are those
// of the inboxmq_breaker_state gauge.
type BreakerState int

// States of a [Breaker].
const (
	// BreakerClosed: deliveries run normally and their results are counted.
	BreakerClosed BreakerState = 0
	// BreakerHalfOpen: after the cool-down, one delivery at a time probes
	// the downstream; a success closes the breaker, a failure opens it
	// again.
	BreakerHalfOpen BreakerState = 1
	// BreakerOpen: the downstream is failing; the breaker's queues are
	// paused and deliveries that still arrive are deferred.
	BreakerOpen BreakerState = 2
)

// String returns "closed", "half-open" or "open".
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerHalfOpen:
		return "half-open"
	case BreakerOpen:
		return "open"
	}
	return fmt.Sprintf("BreakerState(%d)", int(s))
}

// RestrictReasonBreaker is the reason under which a [Breaker] restricts
// its queues ([Restricter]); it never lifts another reason's restriction,
// such as an operator's pause.
const RestrictReasonBreaker = "breaker"

// ReasonBreakerOpen is the retry reason of a delivery that a [Breaker]
// held back (deferred without counting an attempt). It is a bounded metric
// label.
const ReasonBreakerOpen = "breaker_open"

// Defaults of [BreakerOpts].
const (
	DefaultBreakerWindow    = 30 * time.Second
	DefaultBreakerThreshold = 0.5
	DefaultBreakerMinCalls  = 10
	DefaultBreakerCoolDown  = 15 * time.Second
)

// Restricter pauses a queue, or limits it to n deliveries at once, for a
// named reason, and lifts that reason's restriction alone.
// *consumer.Consumer implements it.
type Restricter interface {
	Restrict(queue, reason string, n int) error
	Unrestrict(queue, reason string) error
}

// BreakerChange is one transition of a [Breaker], as given to
// BreakerOpts.OnStateChange.
type BreakerChange struct {
	// Downstream is the breaker's BreakerOpts.Downstream.
	Downstream string
	// Queues are the queues guarded by the breaker ([Breaker.Guard]).
	Queues []string
	// From and To are the states before and after the transition.
	From, To BreakerState
	// Failures and Calls are the counts of the window that tripped the
	// breaker (zero on other transitions).
	Failures, Calls uint32
}

// BreakerOpts configure a [Breaker]. A nil *BreakerOpts means the
// defaults; a value out of range makes NewBreaker return an error.
type BreakerOpts struct {
	// Downstream names what the breaker protects (a gateway, an API):
	// routes that guard the same downstream share one breaker. It labels
	// the metrics and the logs. Defaults to "default".
	Downstream string
	// Window is the rolling window over which failures are counted (in
	// ten buckets). Defaults to DefaultBreakerWindow (30s).
	Window time.Duration
	// Threshold is the share of failures among the window's calls, from
	// 0 (exclusive) to 1, at or above which the breaker trips. Defaults to
	// DefaultBreakerThreshold (0.5).
	Threshold float64
	// MinCalls is the number of calls the window must hold before the
	// breaker may trip, so that a few failures of a quiet route do not
	// trip it. Defaults to DefaultBreakerMinCalls (10).
	MinCalls int
	// CoolDown is how long the breaker stays open before it lets one
	// delivery probe the downstream. Defaults to DefaultBreakerCoolDown
	// (15s).
	CoolDown time.Duration
	// Target pauses the guarded queues while the breaker is open and
	// limits them to one delivery at a time while it is half-open, under
	// reason [RestrictReasonBreaker]. Defaults to nil: the breaker only
	// defers the deliveries that reach it while open (each one then
	// travels through a retry queue).
	Target Restricter
	// IsFailure tells a failure of the downstream from any other result.
	// Defaults to: the error is classified (retry.Classify) as a counted
	// retry. Successes and permanent errors (a problem of the message, not
	// of the downstream) count as successes. Duplicates, deferrals,
	// interruptions and a stopping worker's cancelled handlers are never
	// counted, whatever IsFailure says: they say nothing of the
	// downstream.
	IsFailure func(err error) bool
	// Logger logs one line per transition (warn when it opens, info
	// otherwise). Defaults to nil, which discards them.
	Logger *slog.Logger
	// OnStateChange is called on each transition, after the target has
	// been told. It runs synchronously, with the breaker's state locked:
	// keep it fast and do not call the breaker from it. Defaults to
	// nothing.
	OnStateChange func(BreakerChange)
}

func (o *BreakerOpts) withDefaults() BreakerOpts {
	var out BreakerOpts
	if o != nil {
		out = *o
	}
	if out.Downstream == "" {
		out.Downstream = "default"
	}
	if out.Window == 0 {
		out.Window = DefaultBreakerWindow
	}
	if out.Threshold == 0 {
		out.Threshold = DefaultBreakerThreshold
	}
	if out.MinCalls == 0 {
		out.MinCalls = DefaultBreakerMinCalls
	}
	if out.CoolDown == 0 {
		out.CoolDown = DefaultBreakerCoolDown
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return out
}

func (o BreakerOpts) validate() error {
	switch {
	case o.Window < 100*time.Millisecond:
		return fmt.Errorf("middleware: Breaker %q: Window %s: want at least 100ms", o.Downstream, o.Window)
	case o.Threshold <= 0 || o.Threshold > 1:
		return fmt.Errorf("middleware: Breaker %q: Threshold %g: want a share above 0, at most 1", o.Downstream, o.Threshold)
	case o.MinCalls < 1:
		return fmt.Errorf("middleware: Breaker %q: MinCalls %d: want at least 1", o.Downstream, o.MinCalls)
	case o.CoolDown < 10*time.Millisecond:
		return fmt.Errorf("middleware: Breaker %q: CoolDown %s: want at least 10ms", o.Downstream, o.CoolDown)
	}
	return nil
}

// Breaker is a circuit breaker on a downstream that the deliveries of one
// or more routes call. The state machine is sony/gobreaker's: it counts
// the results of the deliveries over a rolling window, trips when the
// share of failures reaches the threshold (once the window holds MinCalls
// calls), stays open for the cool-down, then lets one delivery at a time
// probe (half-open) and closes on the first success or opens again on a
// failure.
//
// What it does to deliveries, so that a dead downstream does not burn
// their attempts and fill the dead-letter queue:
//
//   - open: the guarded queues are paused through BreakerOpts.Target (the
//     consumer's own pause, under its own reason, so an operator's pause
//     and the breaker's never undo each other); a delivery that still
//     reaches the breaker (prefetched before the pause) is not run: it is
//     deferred (retry.Defer, reason [ReasonBreakerOpen]) until about the
//     end of the cool-down, without counting an attempt;
//   - a delivery that was running when the breaker opened and then fails
//     is deferred the same way: its failure is the downstream's, not its
//     own;
//   - half-open: the queues are limited to one delivery at a time; the
//     probe is a real attempt and counts as one, so a message that fails
//     alone still reaches the dead-letter queue after its attempts;
//   - closed: the restriction is lifted.
//
// The breaker never dead-letters anything itself. Each transition is
// logged and reported to BreakerOpts.OnStateChange. A Breaker is safe for
// concurrent use; call [Breaker.Close] when done with it.
type Breaker struct {
	opts BreakerOpts
	cb   *gobreaker.TwoStepCircuitBreaker[struct{}]

	mu       sync.Mutex
	queues   []string
	openedAt time.Time
	timer    *time.Timer
	closed   bool
}

// NewBreaker returns a closed breaker.
func NewBreaker(opts *BreakerOpts) (*Breaker, error) {
	o := opts.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	b := &Breaker{opts: o}
	b.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:         o.Downstream,
		MaxRequests:  1,
		Interval:     o.Window,
		BucketPeriod: o.Window / 10,
		Timeout:      o.CoolDown,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			// Calls still running are in Requests: judge the finished ones.
			n := c.TotalSuccesses + c.TotalFailures
			return n >= uint32(o.MinCalls) && float64(c.TotalFailures) >= o.Threshold*float64(n)
		},
		IsExcluded:    func(err error) bool { return errors.Is(err, errExcluded) },
		OnStateChange: b.onStateChange,
	})
	return b, nil
}

// State returns the breaker's state now (an open breaker past its
// cool-down reports half-open).
func (b *Breaker) State() BreakerState { return stateOf(b.cb.State()) }

// Close stops the breaker's cool-down timer. The breaker keeps answering
// but no longer moves from open to half-open by itself.
func (b *Breaker) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.timer != nil {
		b.timer.Stop()
	}
}

// Guard returns the handler middleware that puts queue's deliveries
// behind the breaker. Mount it in HandlerOpts.Middleware of queue's route,
// around the code that calls the downstream; several routes may guard one
// breaker (each with its own queue). A queue guarded while the breaker is
// not closed is restricted at once.
func (b *Breaker) Guard(queue string) inboxtype.Middleware {
	b.mu.Lock()
	if !slices.Contains(b.queues, queue) {
		b.queues = append(b.queues, queue)
	}
	b.mu.Unlock()
	if s := b.State(); s != BreakerClosed {
		b.restrict([]string{queue}, s)
	}
	return func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
		return func(ctx context.Context, d *inboxtype.Delivery) error {
			admittedClosed := b.cb.State() == gobreaker.StateClosed
			done, err := b.cb.Allow()
			if err != nil {
				return retry.WithReason(ReasonBreakerOpen, retry.Defer(b.holdFor(),
					fmt.Errorf("middleware: breaker %q is %s: delivery held back: %w", b.opts.Downstream, b.State(), err)))
			}
			herr := next(ctx, d)
			failed, counted := b.judge(ctx, herr)
			switch {
			case !counted:
				done(errExcluded) // neither a success nor a failure
			case failed:
				done(errFailed)
			default:
				done(nil)
			}
			if failed && admittedClosed && b.cb.State() != gobreaker.StateClosed {
				// The breaker opened while this delivery ran: its failure is
				// the downstream's; defer it without counting an attempt.
				return retry.WithReason(ReasonBreakerOpen, retry.Defer(b.holdFor(),
					fmt.Errorf("middleware: breaker %q opened: %w", b.opts.Downstream, herr)))
			}
			return herr
		}
	}
}

var (
	errFailed   = errors.New("middleware: breaker: downstream failure")
	errExcluded = errors.New("middleware: breaker: not counted")
)

// judge classifies a result: failed (a failure of the downstream) and
// counted (it says anything about the downstream at all).
func (b *Breaker) judge(ctx context.Context, err error) (failed, counted bool) {
	if err == nil {
		return false, true
	}
	if ctx.Err() != nil && context.Cause(ctx) != nil && !errors.Is(context.Cause(ctx), context.DeadlineExceeded) &&
		!errors.Is(context.Cause(ctx), ErrTimeout) {
		return false, false // stopping, or a lost lock: not the downstream
	}
	dec := retry.Classify(err)
	switch {
	case dec.Kind == retry.KindInterrupted, dec.Kind == retry.KindDuplicate, dec.Kind == retry.KindRetry && dec.Uncounted:
		// Nothing was asked of the downstream, or nothing came of it.
		return false, false
	}
	if b.opts.IsFailure != nil {
		return b.opts.IsFailure(err), true
	}
	return dec.Kind == retry.KindRetry, true
}

// holdFor is how long a held-back delivery is deferred: what is left of
// the cool-down, or a whole cool-down while half-open.
func (b *Breaker) holdFor() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if left := time.Until(b.openedAt.Add(b.opts.CoolDown)); left > 0 {
		return left
	}
	return b.opts.CoolDown
}

// onStateChange runs under gobreaker's lock: it must not call b.cb.
func (b *Breaker) onStateChange(_ string, from, to gobreaker.State) {
	f, t := stateOf(from), stateOf(to)
	b.mu.Lock()
	queues := slices.Clone(b.queues)
	if t == BreakerOpen {
		b.openedAt = time.Now()
		if b.timer != nil {
			b.timer.Stop()
		}
		if !b.closed {
			// gobreaker moves to half-open when asked after the cool-down;
			// with the queues paused nobody asks, so the timer does.
			b.timer = time.AfterFunc(b.opts.CoolDown, func() { b.cb.State() })
		}
	}
	b.mu.Unlock()
	b.restrict(queues, t)
	change := BreakerChange{Downstream: b.opts.Downstream, Queues: queues, From: f, To: t}
	level := slog.LevelInfo
	if t == BreakerOpen {
		level = slog.LevelWarn
	}
	b.opts.Logger.LogAttrs(context.Background(), level, "middleware: breaker "+t.String(),
		slog.String("downstream", b.opts.Downstream), slog.Any("queues", queues),
		slog.String("from", f.String()), slog.String("to", t.String()))
	if b.opts.OnStateChange != nil {
		b.opts.OnStateChange(change)
	}
}

// restrict applies state s to the target for queues.
func (b *Breaker) restrict(queues []string, s BreakerState) {
	if b.opts.Target == nil {
		return
	}
	for _, q := range queues {
		var err error
		switch s {
		case BreakerOpen:
			err = b.opts.Target.Restrict(q, RestrictReasonBreaker, 0)
		case BreakerHalfOpen:
			err = b.opts.Target.Restrict(q, RestrictReasonBreaker, 1)
		default:
			err = b.opts.Target.Unrestrict(q, RestrictReasonBreaker)
		}
		if err != nil {
			b.opts.Logger.LogAttrs(context.Background(), slog.LevelError, "middleware: breaker could not restrict its queue",
				slog.String("downstream", b.opts.Downstream), slog.String("queue", q), slog.Any("error", err))
		}
	}
}

func stateOf(s gobreaker.State) BreakerState {
	switch s {
	case gobreaker.StateOpen:
		return BreakerOpen
	case gobreaker.StateHalfOpen:
		return BreakerHalfOpen
	}
	return BreakerClosed
}
