package producer

import (
	"errors"
	"fmt"
)

// ErrClosed is returned by a publish on a closed [Producer], and by a
// publish in flight when [Producer.Close] is called.
var ErrClosed = errors.New("producer: closed")

// ErrNacked is in the chain of the error of a publish that the broker kept
// nacking until the retries ran out.
var ErrNacked = errors.New("producer: broker nacked the publish")

// ErrNoID is returned for a [Message] with neither an idempotency key nor
// a message id.
var ErrNoID = errors.New("producer: a message needs an idempotency key or a message id")

// ErrUnroutable matches any [*UnroutableError] with errors.Is.
var ErrUnroutable error = &UnroutableError{}

// UnroutableError is returned when the broker returned a message that no
// queue would get (no binding matched its routing key): nothing was
// enqueued. It is not retried: declaring the queue or the binding is a
// deployment step. Its Is matches any UnroutableError, so
// errors.Is(err, producer.ErrUnroutable) tells it apart.
type UnroutableError struct {
	// Exchange and RoutingKey are the message's destination.
	Exchange, RoutingKey string
	// ReplyCode and ReplyText are the broker's (312 NO_ROUTE).
	ReplyCode uint16
	ReplyText string
}

func (e *UnroutableError) Error() string {
	return fmt.Sprintf("producer: message to exchange %q with routing key %q is unroutable: %d %s",
		e.Exchange, e.RoutingKey, e.ReplyCode, e.ReplyText)
}

// Is reports whether target is an *UnroutableError (any instance).
func (e *UnroutableError) Is(target error) bool {
	_, ok := target.(*UnroutableError)
	return ok
}

// InvalidError is returned for a message refused before it was sent: a
// body that cannot be encoded, fails its own Validate, or has an invalid
// idempotency key, or properties too large for the connection's frame.
// Retrying cannot help.
type InvalidError struct {
	Err error
}

func (e *InvalidError) Error() string { return "producer: invalid message: " + e.Err.Error() }

func (e *InvalidError) Unwrap() error { return e.Err }

// Is reports whether target is an *InvalidError (any instance).
func (e *InvalidError) Is(target error) bool {
	_, ok := target.(*InvalidError)
	return ok
}
