package retry

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Policy decides how long to wait before attempt+1 after attempt failed with
// err, and whether another attempt is allowed at all. attempt is 1-based: the
// first delivery is attempt 1.
type Policy interface {
	NextDelay(attempt int, err error) (delay time.Duration, ok bool)
}

// PolicyFunc adapts a function to [Policy].
type PolicyFunc func(attempt int, err error) (time.Duration, bool)

// NextDelay calls f.
func (f PolicyFunc) NextDelay(attempt int, err error) (time.Duration, bool) { return f(attempt, err) }

// Exponential is exponential backoff with jitter, bounded in delay and in
// attempts. The zero value is usable: every field has a default.
type Exponential struct {
	// InitialInterval is the delay after the first failure.
	// Defaults to 1s.
	InitialInterval time.Duration
	// Multiplier grows the delay per attempt. Defaults to 2.
	Multiplier float64
	// RandomizationFactor is the jitter: the delay is drawn uniformly from
	// [d·(1−f), d·(1+f)]. Defaults to 0.2; -1 disables jitter.
	RandomizationFactor float64
	// MaxInterval caps a single delay. Defaults to 10m.
	MaxInterval time.Duration
	// MaxAttempts is the total number of attempts, the first one included;
	// after it the delivery is dead-lettered. Defaults to 8.
	MaxAttempts int
}

// DefaultPolicy is the policy used when a handler sets none: 8 attempts,
// 1s·2ⁿ with 20 % jitter, capped at 10 minutes.
var DefaultPolicy Policy = Exponential{}

func (e Exponential) withDefaults() Exponential {
	if e.InitialInterval <= 0 {
		e.InitialInterval = time.Second
	}
	if e.Multiplier <= 1 {
		e.Multiplier = 2
	}
	switch {
	case e.RandomizationFactor < 0:
		e.RandomizationFactor = 0
	case e.RandomizationFactor == 0:
		e.RandomizationFactor = 0.2
	case e.RandomizationFactor > 1:
		e.RandomizationFactor = 1
	}
	if e.MaxInterval <= 0 {
		e.MaxInterval = 10 * time.Minute
	}
	if e.MaxAttempts <= 0 {
		e.MaxAttempts = 8
	}
	return e
}

// Attempts reports the bound on attempts, defaults applied.
func (e Exponential) Attempts() int { return e.withDefaults().MaxAttempts }

// NextDelay implements [Policy]. It refuses once attempt reaches MaxAttempts.
func (e Exponential) NextDelay(attempt int, _ error) (time.Duration, bool) {
	e = e.withDefaults()
	if attempt >= e.MaxAttempts {
		return 0, false
	}
	b := e.backOff()
	var d time.Duration
	for i := 0; i < max(attempt, 1); i++ {
		d = b.NextBackOff()
	}
	return d, true
}

func (e Exponential) backOff() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = e.InitialInterval
	b.Multiplier = e.Multiplier
	b.RandomizationFactor = e.RandomizationFactor
	b.MaxInterval = e.MaxInterval
	b.MaxElapsedTime = 0 // bounded by attempts, not wall time
	b.Reset()
	return b
}

// InProcess is the short in-process retry for blips (a dropped connection,
// a serialization failure). The zero value is usable.
type InProcess struct {
	// Tries is the number of extra in-process tries after the first call.
	// Defaults to 2; -1 disables in-process retries.
	Tries int
	// InitialInterval is the first pause. Defaults to 20ms.
	InitialInterval time.Duration
	// MaxInterval caps one pause. Defaults to 200ms.
	MaxInterval time.Duration
}

func (p InProcess) withDefaults() InProcess {
	if p.Tries == 0 {
		p.Tries = 2
	}
	if p.Tries < 0 {
		p.Tries = 0
	}
	if p.InitialInterval <= 0 {
		p.InitialInterval = 20 * time.Millisecond
	}
	if p.MaxInterval <= 0 {
		p.MaxInterval = 200 * time.Millisecond
	}
	return p
}

// Do calls fn until it succeeds, returns an error that [Classify] does not
// call Retry (with no explicit delay), or the tries run out; it sleeps with
// exponential backoff and jitter between calls, and stops early when ctx is
// done (the context error is joined to fn's last error). fn must hold no
// claim or transaction across calls: each call starts from scratch. rules
// are the handler's classification rules.
func (p InProcess) Do(ctx context.Context, fn func(ctx context.Context) error, rules ...Rule) error {
	p = p.withDefaults()
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = p.InitialInterval
	b.MaxInterval = p.MaxInterval
	b.MaxElapsedTime = 0
	b.Reset()
	var last error
	op := func() error {
		last = fn(ctx)
		if last == nil {
			return nil
		}
		d := Classify(last, rules...)
		if d.Kind != KindRetry || d.Delay > 0 {
			return backoff.Permanent(last)
		}
		return last
	}
	err := backoff.Retry(op, backoff.WithContext(backoff.WithMaxRetries(b, uint64(p.Tries)), ctx))
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(last, ctxErr) {
		return errors.Join(last, ctxErr)
	}
	return last
}

// Tier picks the broker delay tier for a wanted delay: the smallest tier that
// is at least d, or the largest tier. tiers must be sorted ascending and
// non-empty.
func Tier(tiers []time.Duration, d time.Duration) time.Duration {
	for _, t := range tiers {
		if t >= d {
			return t
		}
	}
	return tiers[len(tiers)-1]
}
