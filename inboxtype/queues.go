package inboxtype

import "time"

// The names of the queues inboxmq declares around a route's work queue.
// They are wire format, stable across releases: an ops script, an alert
// rule or a test may build them with these functions instead of by hand.

// DeadLetterQueue returns the name of the dead-letter queue of queue,
// "<queue>.dlq" (payments.dlq): where a message that failed permanently,
// or ran out of attempts, waits for an operator with its reason
// ([DeadLetterReason]). It is the default of a route's DLQ; a route
// configured with another name uses that one instead.
func DeadLetterQueue(queue string) string { return queue + ".dlq" }

// RetryQueue returns the name of the wait queue of one broker-side delay
// tier of queue, "<queue>.retry.<tier>" with the tier as
// time.Duration.String writes it (payments.retry.5s,
// payments.retry.1m0s). A retried message waits there for the tier's
// time and then goes back to queue.
func RetryQueue(queue string, tier time.Duration) string {
	return queue + ".retry." + tier.String()
}

// ParkedQueue returns the name of the queue where the deliveries of queue
// whose idempotency key an operator blocked wait, "<queue>.parked"
// (payments.parked), with the headers [HeaderParkedReason],
// [HeaderParkedPattern] and [HeaderParkedAt], until an unblock releases
// them back to queue.
func ParkedQueue(queue string) string { return queue + ".parked" }
