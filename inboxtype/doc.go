// Package inboxtype is inboxmq's shared vocabulary: the untyped [Delivery]
// and the typed [Message] that flow through a worker, the [Status] of a
// delivery, the [Outcome] the consumer settled it on, the [Observer] that
// hears about both, the AMQP header names inboxmq reads and writes (and
// why a dead letter died: [DeadLetterReason]), the names of the queues
// around a work queue ([DeadLetterQueue], [RetryQueue], [ParkedQueue]),
// and the handler and middleware signatures.
//
// It is a leaf, as rivertype is for River: it imports only package retry
// and the AMQP client's types, so that the worker's runtime (its consumer,
// metrics and middleware), the inbox and the outbox can all speak of one
// delivery without importing each other.
//
// # Handlers and middleware
//
// A typed [Handler] receives a decoded [Message]; middleware wraps the
// untyped [DeliveryHandler] and never acks or nacks:
//
//	logEach := func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
//		return func(ctx context.Context, d *inboxtype.Delivery) error {
//			err := next(ctx, d)
//			log.Printf("%s %s: %v", d.Queue, d.Key, err)
//			return err
//		}
//	}
//
// A route takes such middleware in
// [github.com/inboxmq/inboxmq.RouteOpts].Middleware; only the worker turns
// a handler's error into an AMQP outcome.
//
// # Queues and dead letters
//
// A script, an alert or a test names a route's queues as inboxmq does, and
// reads why a dead letter died from its headers:
//
//	d, ok, err := ch.Get(inboxtype.DeadLetterQueue("payments"), false) // payments.dlq
//	if err == nil && ok {
//		fmt.Println(inboxtype.DeadLetterReason(d.Headers)) // "decode: …", or "expired (broker)"
//		fmt.Println(inboxtype.DeadLetterOrigin(d.Headers)) // payments
//	}
//
// # Idempotency keys
//
// A payload names its business identity through [Keyer]; [ValidKey] says
// which keys are acceptable. [Fingerprinter] lets a payload choose the
// bytes that tell a copy of a job from another job reusing its key.
package inboxtype
