// Package retry is inboxmq's error taxonomy: it decides what the consumer does
// with a delivery whose handler returned an error.
//
// It is the leaf of the module (it imports nothing of inboxmq, nor pgx, Redis
// or AMQP), so every other package can build and recognise these errors
// without import cycles.
//
// # Outcomes
//
// A handler only ever returns an error. [Classify] turns it into a [Decision]:
//
//	nil                          -> Succeeded   (ack)
//	ErrDuplicate / Duplicate(…)  -> Duplicate   (ack, counted by source)
//	Permanent(err)               -> Permanent   (dead-letter now, with the reason)
//	After(d, err)                -> Retry       (redeliver after d, attempt + 1)
//	Interrupted(err)             -> Interrupted (requeue, the attempt is not counted)
//	an error with Retryable()    -> Retry or Permanent, as the error decides
//	anything else                -> Retry with the handler's [Policy], until MaxAttempts
//
// Errors are built with constructors, never struct literals, and every type
// has an Is method that matches any instance of that type:
//
//	if errors.Is(err, &retry.PermanentError{}) { … }
//
// # Reasons
//
// Every decision carries a Reason: a short, bounded string used as a
// Prometheus label (job_retry_total{reason}) and in the x-error header of a
// dead letter. [WithReason] attaches one to any error.
//
// # Backoff
//
// [Exponential] is the default [Policy]: exponential backoff with jitter,
// bounded by MaxInterval and MaxAttempts, built on
// github.com/cenkalti/backoff/v4. [Do] runs a short, context-aware in-process
// retry loop for blips.
package retry
