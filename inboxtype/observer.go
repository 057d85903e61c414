package inboxtype

import (
	"time"

	"github.com/inboxmq/inboxmq/retry"
)

// Action is what the consumer did with a delivery at the end of its path.
type Action string

const (
	// ActionAcked: acked after success or a detected duplicate.
	ActionAcked Action = "acked"
	// ActionRetried: republished (with confirm) to a delay tier, then acked.
	ActionRetried Action = "retried"
	// ActionDeadLettered: republished (with confirm) to the DLQ, then acked.
	ActionDeadLettered Action = "dead_lettered"
	// ActionRequeued: nacked with requeue (shutdown or interruption); the
	// attempt is not counted.
	ActionRequeued Action = "requeued"
	// ActionAbandoned: nothing could be settled (the channel was gone); the
	// broker redelivers.
	ActionAbandoned Action = "abandoned"
	// ActionRetriedInProcess: the run's error is retried in process (the
	// chain runs again in this worker after a short pause). Only the
	// hooks of [Delivery.OnSettled] see it, for a run that is not the
	// last; observers hear of it through [Observer.OnInProcessRetry].
	ActionRetriedInProcess Action = "retried_in_process"
)

// Outcome describes how one delivery ended. It is the consumer's own
// account: observers take the reason and the kind from Decision rather
// than classifying the error again, since the route's Rules and the retry
// policy (which turns a last failed attempt into reason exhausted) decide.
type Outcome struct {
	// Decision is the verdict the delivery was settled on: the route's
	// classification of the handler's last error, with Reason
	// retry.ReasonExhausted when the policy allowed no further attempt.
	Decision retry.Decision
	// Action is what the consumer did.
	Action Action
	// Delay is the broker delay tier used (ActionRetried), or the nominal
	// pause before the next in-process try (ActionRetriedInProcess).
	Delay time.Duration
	// Duration is the time from receipt to settlement.
	Duration time.Duration
	// Handled is the time the last run of the handler chain took
	// (middleware, decoding, the inbox and the handler): zero when no
	// handler ran (a dead letter the broker made, a stop before the run).
	Handled time.Duration
	// InProcessRetries is the number of in-process tries after the first
	// (for ActionRetriedInProcess: before the run it describes).
	InProcessRetries int
	// Err is an error settling the delivery (a failed publish or ack), nil
	// when the action succeeded.
	Err error
}

// Status returns the settlement status the consumer reported for this
// outcome, just before OnOutcome: StatusCompleted or StatusDuplicate when
// acked, StatusRetry when retried through a delay tier,
// StatusDeadLettered, StatusRequeued, StatusRetryInProcess for
// ActionRetriedInProcess (a hook's outcome, never reported as a
// transition), and StatusFailed when nothing could be settled
// (ActionAbandoned).
func (o Outcome) Status() Status {
	switch o.Action {
	case ActionAcked:
		if o.Decision.Kind == retry.KindDuplicate {
			return StatusDuplicate
		}
		return StatusCompleted
	case ActionRetried:
		return StatusRetry
	case ActionDeadLettered:
		return StatusDeadLettered
	case ActionRequeued:
		return StatusRequeued
	case ActionRetriedInProcess:
		return StatusRetryInProcess
	default:
		return StatusFailed
	}
}

// ConnState is the state of the consumer's broker connection.
type ConnState string

const (
	// ConnConnected: connected, topology declared, consuming.
	ConnConnected ConnState = "connected"
	// ConnDisconnected: the connection or a channel closed; reconnecting.
	ConnDisconnected ConnState = "disconnected"
	// ConnStopped: the consumer stopped.
	ConnStopped ConnState = "stopped"
)

// Observer receives the consumer's events. Implementations must be safe for
// concurrent use and fast: they run on the delivery path. Embed
// [NopObserver] to implement only some methods.
type Observer interface {
	// OnTransition reports a status transition of one delivery (Status*
	// constants); err is the error that caused it, if any. For the
	// settlement statuses, OnOutcome follows with the decision.
	OnTransition(d *Delivery, status Status, err error)
	// OnOutcome reports how a delivery ended.
	OnOutcome(d *Delivery, o Outcome)
	// OnInProcessRetry reports an in-process retry (StatusRetryInProcess)
	// about to sleep for delay; dec is the route's classification of the
	// error that caused it.
	OnInProcessRetry(d *Delivery, dec retry.Decision, delay time.Duration)
	// OnConnState reports a connection state change; err is the cause of a
	// disconnection.
	OnConnState(state ConnState, err error)
}

// NopObserver implements [Observer] with methods that do nothing.
type NopObserver struct{}

// OnTransition does nothing.
func (NopObserver) OnTransition(*Delivery, Status, error) {}

// OnOutcome does nothing.
func (NopObserver) OnOutcome(*Delivery, Outcome) {}

// OnInProcessRetry does nothing.
func (NopObserver) OnInProcessRetry(*Delivery, retry.Decision, time.Duration) {}

// OnConnState does nothing.
func (NopObserver) OnConnState(ConnState, error) {}
