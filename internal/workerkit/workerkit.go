// Package workerkit lets inboxtest, the test kit users run against their
// own handlers, reach into an inboxmq.Worker it did not start: a route's
// complete chain (the worker's middleware, decoding, the inbox and the
// handler) and the inbox check Start would run. The root package sets the
// functions when it is initialised; nothing else may.
package workerkit

import (
	"context"

	"github.com/inboxmq/inboxmq/internal/consumer"
)

// Route returns worker's route of queue, as the consumer runs it.
var Route func(worker any, queue string) (consumer.Route, error)

// Prepare runs the worker's inbox check (Store.Check), which Start would
// run, so that its handlers can serve deliveries without a start.
var Prepare func(ctx context.Context, worker any) error
