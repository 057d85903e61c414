package retry

import (
	"errors"
	"fmt"
	"time"
)

// ErrDuplicate reports that the delivery's effect has already been committed
// (or is being committed by another worker that holds the claim). The consumer
// acks it and counts it.
var ErrDuplicate = errors.New("retry: duplicate message")

// ErrKeyConflict reports that an idempotency key was reused for a different
// payload: a completed job with the same key but another fingerprint. It is
// permanent (the message is dead-lettered with this reason) because silently
// acking it as a duplicate would swallow a different job.
var ErrKeyConflict = errors.New("retry: idempotency key reused with a different payload")

// Duplicate sources: where a duplicate was caught. They are the bounded
// values of the duplicate_detected_total{source} label.
const (
	SourceCache     = "cache"               // the completed-cache fast path said "completed"
	SourceInbox     = "inbox"               // the inbox unique index said the key is done
	SourceBusiness  = "business_constraint" // a unique violation on a business table
	SourceFenced    = "fenced"              // a fenced completion lost to a newer owner
	SourceClaimHeld = "claim_held"          // another worker holds a live claim (claim mode)
	SourceParked    = "parked"              // the key is blocked; a copy was parked (not a completion)
)

// DuplicateError is a duplicate detected at a named source. It matches
// [ErrDuplicate] with errors.Is. Build it with [Duplicate].
type DuplicateError struct {
	Source string
	Err    error
}

// Duplicate returns an error that classifies as a duplicate caught at source
// (one of the Source constants). err may be nil.
func Duplicate(source string, err error) error {
	return &DuplicateError{Source: source, Err: err}
}

func (e *DuplicateError) Error() string {
	if e.Err == nil {
		return "retry: duplicate message (" + e.Source + ")"
	}
	return "retry: duplicate message (" + e.Source + "): " + e.Err.Error()
}

// Unwrap returns the underlying error, if any.
func (e *DuplicateError) Unwrap() error { return e.Err }

// Is matches ErrDuplicate and any *DuplicateError.
func (e *DuplicateError) Is(target error) bool {
	if target == ErrDuplicate {
		return true
	}
	_, ok := target.(*DuplicateError)
	return ok
}

// PermanentError marks an error that no retry can fix (an undecodable
// payload, a validation failure, a permanent 4xx from a gateway). Build it
// with [Permanent].
type PermanentError struct {
	Err error
}

// Permanent wraps err so that the delivery is dead-lettered at once. A nil err
// still yields a non-nil error.
func Permanent(err error) error {
	if err == nil {
		err = errors.New("permanent failure")
	}
	return &PermanentError{Err: err}
}

func (e *PermanentError) Error() string { return "retry: permanent: " + e.Err.Error() }

// Unwrap returns the wrapped error.
func (e *PermanentError) Unwrap() error { return e.Err }

// Is matches any *PermanentError.
func (e *PermanentError) Is(target error) bool {
	_, ok := target.(*PermanentError)
	return ok
}

// RetryableError marks an error worth retrying, optionally after a given
// delay. Build it with [After] or [Retryable].
type RetryableError struct {
	// Delay is the delay the error asks for; zero means "use the policy".
	Delay time.Duration
	// Uncounted marks a retry that is not a failed attempt (see [Defer]).
	Uncounted bool
	Err       error
}

// After asks for the delivery to be retried after d: exactly d when an
// inboxmq.Worker schedules the retry in its outbox, rounded up to the
// nearest broker delay tier when the retry waits in the broker. A zero d
// lets the handler's policy choose. Under a Worker a delay d also defers
// the delivery's key (or the route's tenant, RouteOpts.Tenant) until d
// ends: the key's next deliveries wait without running.
func After(d time.Duration, err error) error {
	if err == nil {
		err = errors.New("retry requested")
	}
	return &RetryableError{Delay: d, Err: err}
}

// Defer asks for the delivery to be retried after d without counting an
// attempt: the job did not fail, another worker holds its key (a Redis lock
// or a live claim) and will either complete it (the retry is then a
// duplicate) or lose the key when its TTL or lease ends. The attempt number
// stays the same, so a contended key is never dead-lettered for running
// out of attempts; the wait is bounded by the holder's TTL or lease.
func Defer(d time.Duration, err error) error {
	if err == nil {
		err = errors.New("deferred")
	}
	return &RetryableError{Delay: d, Uncounted: true, Err: err}
}

// Retryable marks err as transient; the handler's policy chooses the delay.
func Retryable(err error) error { return After(0, err) }

func (e *RetryableError) Error() string {
	if e.Delay > 0 {
		return fmt.Sprintf("retry: retry after %s: %v", e.Delay, e.Err)
	}
	return "retry: retryable: " + e.Err.Error()
}

// Unwrap returns the wrapped error.
func (e *RetryableError) Unwrap() error { return e.Err }

// Is matches any *RetryableError.
func (e *RetryableError) Is(target error) bool {
	_, ok := target.(*RetryableError)
	return ok
}

// InterruptedError marks work abandoned because the worker is stopping or
// lost its connection. The delivery is requeued and the attempt is not
// counted. Build it with [Interrupted].
type InterruptedError struct {
	Err error
}

// Interrupted wraps err as an interruption (not a failure of the job).
func Interrupted(err error) error {
	if err == nil {
		err = errors.New("interrupted")
	}
	return &InterruptedError{Err: err}
}

func (e *InterruptedError) Error() string { return "retry: interrupted: " + e.Err.Error() }

// Unwrap returns the wrapped error.
func (e *InterruptedError) Unwrap() error { return e.Err }

// Is matches any *InterruptedError.
func (e *InterruptedError) Is(target error) bool {
	_, ok := target.(*InterruptedError)
	return ok
}

// reasonError attaches a bounded reason label to an error.
type reasonError struct {
	reason string
	err    error
}

// WithReason attaches reason (a short, bounded label such as "gateway_5xx")
// to err. The reason becomes Decision.Reason, the job_retry_total{reason}
// label and the prefix of a dead letter's x-error header. It does not change
// how err classifies. WithReason(r, nil) returns nil.
func WithReason(reason string, err error) error {
	if err == nil {
		return nil
	}
	return &reasonError{reason: reason, err: err}
}

func (e *reasonError) Error() string { return e.err.Error() }
func (e *reasonError) Unwrap() error { return e.err }

// RetryReason reports the attached reason.
func (e *reasonError) RetryReason() string { return e.reason }
