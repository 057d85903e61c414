package outbox

import "errors"

var (
	// ErrNoID is returned by Enqueue for a message with neither an ID nor an
	// IdempotencyKey: the outbox never invents a random id, because a
	// handler re-run must produce the same one.
	ErrNoID = errors.New("outbox: message has neither ID nor IdempotencyKey")
	// ErrNoDestination is returned by Enqueue for a message with neither an
	// Exchange nor a RoutingKey.
	ErrNoDestination = errors.New("outbox: message has neither Exchange nor RoutingKey")
)
