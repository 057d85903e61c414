package inboxmq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// ReusePolicy says what a route does with a new delivery of a key that was
// dead-lettered (RouteOpts.AfterDead). A completed key is never run again,
// whatever the policy; a replay from the DLQ (inboxctl dlq replay) always
// takes a dead key up again.
type ReusePolicy string

// Reuse policies.
const (
	// ReuseRun runs the new delivery: the key is taken up again, as a
	// replay would.
	ReuseRun ReusePolicy = "run"
	// ReuseReject dead-letters the new delivery at once, with reason
	// key_dead and the error the key died of; the key's row keeps that
	// error.
	ReuseReject ReusePolicy = "reject"
	// ReuseAttach settles the new delivery as a duplicate of the stored
	// outcome: it is acked without running, and a request gets a reply
	// whose body is {"error": "<the error the key died of>"}, marked
	// x-replayed-outcome.
	ReuseAttach ReusePolicy = "attach"
)

// sourceDeadKey is the duplicate source of a delivery attached to a dead
// key's outcome (ReuseAttach).
const sourceDeadKey = "dead"

// reuseGuard applies policy p to the new deliveries of dead keys: one read
// of the key's row before the inbox, for the routes that ask for it.
func reuseGuard(store *inbox.Store, p ReusePolicy) inboxtype.Middleware {
	return func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
		return func(ctx context.Context, d *inboxtype.Delivery) error {
			if d.Key == "" || inboxtype.HeaderInt(d.Raw.Headers, inboxtype.HeaderReplayCount) > 0 {
				return next(ctx, d) // a replay takes the key up again
			}
			rec, err := store.Get(ctx, d.Namespace, d.Key)
			switch {
			case errors.Is(err, inbox.ErrNotFound):
				return next(ctx, d)
			case err != nil:
				return inbox.MapError(fmt.Errorf("inboxmq: read key %q before its reuse policy: %w", d.Key, err))
			case rec.Status != inbox.RecordDead:
				return next(ctx, d)
			}
			died := "unknown error"
			if rec.LastError != nil {
				died = *rec.LastError
			}
			if p == ReuseAttach {
				body, err := json.Marshal(struct {
					Error string `json:"error"`
				}{died})
				if err != nil {
					return err
				}
				d.Result = body
				return retry.Duplicate(sourceDeadKey, fmt.Errorf("inboxmq: key %q was dead-lettered (%s): attached to its outcome", d.Key, died))
			}
			return retry.Permanent(retry.WithReason(inbox.ReasonKeyDead,
				fmt.Errorf("inboxmq: key %q was dead-lettered (%s); its route rejects a new delivery of it (RouteOpts.AfterDead)", d.Key, died)))
		}
	}
}
