// Package inboxtype is inboxmq's shared vocabulary: the untyped [Delivery]
// and the typed [Message] that flow through a worker, the [Status] of a
// delivery, the [Outcome] the consumer settled it on, the [Observer] that
// hears about both, the AMQP header names inboxmq reads and writes, and
// the handler and middleware signatures.
//
// It is a leaf, as rivertype is for River: it imports only package retry
// and the AMQP client's types, so that the AMQP runtime (package
// consumer), the inbox, the outbox, metrics and middleware can all speak
// of one delivery without importing each other.
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
// Package consumer registers handlers ([github.com/inboxmq/inboxmq/consumer.Register])
// and turns a handler's error into an AMQP outcome.
//
// # Idempotency keys
//
// A payload names its business identity through [Keyer]; [ValidKey] says
// which keys are acceptable. [Fingerprinter] lets a payload choose the
// bytes that tell a copy of a job from another job reusing its key.
package inboxtype
