// Package producer publishes messages to RabbitMQ for inboxmq consumers
// from code that is not inside a database transaction: an HTTP handler, a
// batch job, a command-line tool. A handler that publishes as part of its
// own database transaction uses package outbox instead (outbox.Enqueue in
// the handler's pgx.Tx, published by the relay after the commit): only the
// outbox makes "committed" and "published" one decision.
//
// # Publishing
//
// Build one [Producer] per process with [New], share it between
// goroutines, and publish typed bodies with the free function [Publish]
// (methods cannot be generic, as with river's Insert):
//
//	p, err := producer.New(&producer.Config{URL: "amqp://guest:guest@localhost:5672/"})
//	if err != nil {
//		return err
//	}
//	defer p.Close()
//	err = producer.Publish(ctx, p, "", "payments.requested", Payment{OrderID: "42", AmountCents: 1999}, nil)
//
// Publish returns nil only after the broker confirmed the message
// (publisher confirms): it is persistent and on a queue. Every message is
// published with the mandatory flag, so a message that no queue would get
// is an error ([ErrUnroutable]), never silently dropped.
//
// # Identity
//
// The idempotency key comes from the body ([inboxtype.Keyer], the same
// method the consumer calls) or from [PublishOpts].Key. It travels in the
// header x-idempotency-key, and the message id is derived from it and the
// destination, the way package outbox derives its ids: the same key sent
// to the same destination always gets the same id, so a resend after a
// lost confirm is recognisable as the same message. The receiving inbox
// deduplicates by the key it reads from the payload, never by the message
// id: a resend, a retry or a second producer of the same job is absorbed
// whatever its id.
//
// # Ordered routes
//
// A route with inboxmq.RouteOpts.Ordered applies the messages of one
// ordering key in the order it receives them. Publish to its exchange
// (named after the queue unless configured otherwise) with the ordering
// key, typically the aggregate's id, as routing key: all of the
// aggregate's messages then land in one shard queue. Messages of one key
// keep their order when they are published one after another (each
// Publish returns after its confirm); concurrent Publish calls for one
// key have no order between them.
//
// # Failures
//
// A lost connection or channel, a confirm that never came within
// [Config].PublishTimeout and a broker nack are retried with exponential
// backoff (on a new connection when the old one is gone), bounded by ctx
// and [Config].RetryTimeout. A retry may publish a message the broker
// had already taken: the receiver sees a duplicate with the same key and
// id, which its inbox absorbs. An unroutable message, a missing exchange,
// a refused permission and an invalid message are not retried.
package producer
