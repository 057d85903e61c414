package inboxmq

import (
	"context"
	"errors"
	"fmt"

	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/workerkit"
)

// The test kit (package inboxtest) drives a worker's routes in memory,
// without a broker: it gets a route's chain and checks the store through
// internal/workerkit.
func init() {
	workerkit.Route = func(worker any, queue string) (consumer.Route, error) {
		w, ok := worker.(*Worker)
		if !ok || w == nil {
			return consumer.Route{}, errors.New("not a *inboxmq.Worker")
		}
		for _, r := range w.router.Routes() {
			if r.Queue == queue {
				return r, nil
			}
		}
		return consumer.Route{}, fmt.Errorf("queue %q has no route in the worker", queue)
	}
	workerkit.Prepare = func(ctx context.Context, worker any) error {
		w, ok := worker.(*Worker)
		if !ok || w == nil {
			return errors.New("not a *inboxmq.Worker")
		}
		return w.store.Check(ctx)
	}
}
