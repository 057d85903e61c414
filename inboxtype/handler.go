package inboxtype

import "context"

// DeliveryHandler processes one untyped delivery. It only returns an error;
// the consumer classifies it (package retry) and settles the delivery.
type DeliveryHandler func(ctx context.Context, d *Delivery) error

// Middleware decorates a DeliveryHandler. Middleware never acks or nacks:
// it returns an error (or nil) and the consumer turns the final error into an
// AMQP outcome.
type Middleware func(next DeliveryHandler) DeliveryHandler

// Chain composes middleware, outermost first: Chain(a, b)(h) runs a, then b,
// then h.
func Chain(mw ...Middleware) Middleware {
	return func(next DeliveryHandler) DeliveryHandler {
		for i := len(mw) - 1; i >= 0; i-- {
			if mw[i] != nil {
				next = mw[i](next)
			}
		}
		return next
	}
}

// Handler handles decoded messages of type T.
type Handler[T any] interface {
	Handle(ctx context.Context, msg *Message[T]) error
}

// HandlerFunc adapts a function to [Handler].
type HandlerFunc[T any] func(ctx context.Context, msg *Message[T]) error

// Handle calls f.
func (f HandlerFunc[T]) Handle(ctx context.Context, msg *Message[T]) error { return f(ctx, msg) }
