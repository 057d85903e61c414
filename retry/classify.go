package retry

import (
	"context"
	"errors"
	"time"
)

// Kind is what the consumer does with a delivery.
type Kind int

const (
	// KindSucceeded: the effect is committed; ack.
	KindSucceeded Kind = iota
	// KindDuplicate: the effect was already committed; ack and count.
	KindDuplicate
	// KindRetry: redeliver later (in process for blips, then through a broker
	// delay queue), with the attempt number increased.
	KindRetry
	// KindPermanent: dead-letter now with the reason.
	KindPermanent
	// KindInterrupted: requeue without counting an attempt (shutdown, connection
	// loss).
	KindInterrupted
)

// String returns the lower-case name used in logs and metric labels.
func (k Kind) String() string {
	switch k {
	case KindSucceeded:
		return "succeeded"
	case KindDuplicate:
		return "duplicate"
	case KindRetry:
		return "retry"
	case KindPermanent:
		return "permanent"
	case KindInterrupted:
		return "interrupted"
	default:
		return "unknown"
	}
}

// Reasons used by the classifier when the error names none. They are
// bounded, so they are safe as metric labels.
const (
	ReasonNone        = ""
	ReasonError       = "error"        // an unclassified error
	ReasonPermanent   = "permanent"    // Permanent(err) without a reason
	ReasonRequested   = "requested"    // After/Retryable without a reason
	ReasonTimeout     = "timeout"      // context.DeadlineExceeded
	ReasonDecode      = "decode"       // the payload could not be decoded
	ReasonInvalid     = "invalid"      // the payload failed validation
	ReasonKeyConflict = "key_conflict" // ErrKeyConflict
	ReasonPanic       = "panic"        // a recovered panic
	ReasonExhausted   = "exhausted"    // retries exhausted (dead letter)
)

// Decision is the classifier's verdict on one handler result.
type Decision struct {
	Kind Kind
	// Delay is the delay asked for by the error (Retry only); zero means the
	// policy chooses.
	Delay time.Duration
	// Reason is a bounded label: the error's own (WithReason or a
	// RetryReason() string method), else a default for the kind.
	Reason string
	// Source is where a duplicate was caught (Duplicate only).
	Source string
	// Uncounted: a Retry that is not a failed attempt ([Defer]); the attempt
	// number is not increased and the policy's bound does not apply.
	Uncounted bool
	// Err is the classified error (nil for Succeeded).
	Err error
}

// Rule is a user classification rule. It returns ok=false to leave err to the
// next rule and finally to the built-in taxonomy. Rules run before the
// built-in taxonomy, so they can, say, make a specific client error permanent.
type Rule func(err error) (d Decision, ok bool)

// retryableError is the behavioural interface (like pgconn.SafeToRetry): any
// error in the chain that implements it decides for itself.
type retryableError interface {
	Retryable() bool
}

type reasoner interface {
	RetryReason() string
}

// Classify returns the decision for err. It is the single place where errors
// become outcomes; the order of checks is:
//
//  1. nil -> Succeeded;
//  2. the rules, in order;
//  3. InterruptedError -> Interrupted;
//  4. ErrDuplicate (any DuplicateError) -> Duplicate;
//  5. ErrKeyConflict -> Permanent (reason key_conflict);
//  6. PermanentError -> Permanent;
//  7. RetryableError -> Retry with its delay (Uncounted for Defer);
//  8. an error in the chain with Retryable() bool -> Retry or Permanent;
//  9. context.DeadlineExceeded -> Retry (reason timeout);
//  10. anything else -> Retry (reason error); the policy bounds the attempts.
//
// The reason is the first RetryReason() found in the chain (see WithReason),
// else a default for the branch taken.
func Classify(err error, rules ...Rule) Decision {
	if err == nil {
		return Decision{Kind: KindSucceeded}
	}
	for _, r := range rules {
		if r == nil {
			continue
		}
		if d, ok := r(err); ok {
			if d.Err == nil {
				d.Err = err
			}
			if d.Reason == "" {
				d.Reason = reasonOf(err, defaultReason(d.Kind))
			}
			return d
		}
	}

	var (
		interrupted *InterruptedError
		dup         *DuplicateError
		perm        *PermanentError
		retryable   *RetryableError
		behaviour   retryableError
	)
	switch {
	case errors.As(err, &interrupted):
		return Decision{Kind: KindInterrupted, Reason: reasonOf(err, "interrupted"), Err: err}
	case errors.As(err, &dup):
		return Decision{Kind: KindDuplicate, Source: dup.Source, Reason: reasonOf(err, "duplicate"), Err: err}
	case errors.Is(err, ErrDuplicate):
		return Decision{Kind: KindDuplicate, Source: SourceInbox, Reason: reasonOf(err, "duplicate"), Err: err}
	case errors.Is(err, ErrKeyConflict):
		return Decision{Kind: KindPermanent, Reason: reasonOf(err, ReasonKeyConflict), Err: err}
	case errors.As(err, &perm):
		return Decision{Kind: KindPermanent, Reason: reasonOf(err, ReasonPermanent), Err: err}
	case errors.As(err, &retryable):
		return Decision{Kind: KindRetry, Delay: retryable.Delay, Uncounted: retryable.Uncounted, Reason: reasonOf(err, ReasonRequested), Err: err}
	case errors.As(err, &behaviour):
		if behaviour.Retryable() {
			return Decision{Kind: KindRetry, Reason: reasonOf(err, ReasonError), Err: err}
		}
		return Decision{Kind: KindPermanent, Reason: reasonOf(err, ReasonPermanent), Err: err}
	case errors.Is(err, context.DeadlineExceeded):
		return Decision{Kind: KindRetry, Reason: reasonOf(err, ReasonTimeout), Err: err}
	default:
		return Decision{Kind: KindRetry, Reason: reasonOf(err, ReasonError), Err: err}
	}
}

func defaultReason(k Kind) string {
	switch k {
	case KindPermanent:
		return ReasonPermanent
	case KindRetry:
		return ReasonError
	case KindDuplicate:
		return "duplicate"
	case KindInterrupted:
		return "interrupted"
	default:
		return ReasonNone
	}
}

// reasonOf returns the first RetryReason() in err's chain, or def.
func reasonOf(err error, def string) string {
	var r reasoner
	if errors.As(err, &r) {
		if s := r.RetryReason(); s != "" {
			return s
		}
	}
	return def
}
