package consumer

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
)

// Outcome describes how one delivery ended.
type Outcome struct {
	// Decision is the classifier's verdict on the handler's last error.
	Decision retry.Decision
	// Action is what the consumer did.
	Action Action
	// Delay is the broker delay tier used (ActionRetried only).
	Delay time.Duration
	// Duration is the time from receipt to settlement.
	Duration time.Duration
	// InProcessRetries is the number of in-process tries after the first.
	InProcessRetries int
	// Err is an error settling the delivery (a failed publish or ack), nil
	// when the action succeeded.
	Err error
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
	// constants); err is the error that caused it, if any.
	OnTransition(d *Delivery, status string, err error)
	// OnOutcome reports how a delivery ended.
	OnOutcome(d *Delivery, o Outcome)
	// OnInProcessRetry reports an in-process retry about to sleep for delay.
	OnInProcessRetry(d *Delivery, dec retry.Decision, delay time.Duration)
	// OnConnState reports a connection state change; err is the cause of a
	// disconnection.
	OnConnState(state ConnState, err error)
}

// NopObserver implements [Observer] with methods that do nothing.
type NopObserver struct{}

// OnTransition does nothing.
func (NopObserver) OnTransition(*Delivery, string, error) {}

// OnOutcome does nothing.
func (NopObserver) OnOutcome(*Delivery, Outcome) {}

// OnInProcessRetry does nothing.
func (NopObserver) OnInProcessRetry(*Delivery, retry.Decision, time.Duration) {}

// OnConnState does nothing.
func (NopObserver) OnConnState(ConnState, error) {}
