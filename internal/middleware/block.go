package middleware

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/controlrun"
	"github.com/inboxmq/inboxmq/retry"
)

// Parker parks a delivery: it makes a durable copy in the delivery's
// parked queue and returns only once the broker confirmed it.
// *controlrun.Parker implements it.
type Parker interface {
	Park(ctx context.Context, d *inboxtype.Delivery, b control.Block) error
}

// BlockOpts configure [Block]. A nil *BlockOpts means the defaults.
type BlockOpts struct {
	// Logger logs each parked delivery at info level. Defaults to nil,
	// which discards the lines.
	Logger *slog.Logger
}

// Block returns handler middleware that parks deliveries whose idempotency
// key is blocked (inboxctl block) instead of processing them.
//
// Install it in HandlerOpts.Middleware, which runs after decoding: the key
// (Delivery.Key) is empty in router-wide middleware, and a delivery without
// a key passes through. The check is in memory ([controlrun.Watcher.Blocked]);
// only a hit is confirmed in the database ([controlrun.Watcher.Confirm]), so a
// delivery that an unblock released is processed even by a worker whose
// snapshot is a moment old. If that re-check fails, the snapshot decides.
//
// Parking keeps the house rule that middleware never acks: Block copies the
// delivery to "<queue>.parked" through p, with publisher confirms, and then
// returns a duplicate error (source [SourceParked]), which the consumer
// executes as an ack. The original is therefore acked only after its copy
// is durable (invariant 1). If parking fails, Block returns a retryable
// error (reason "park") and the handler is not run. inboxctl unblock (or
// [control.Release]) moves parked messages back to the work queue.
func Block(w *controlrun.Watcher, p Parker, opts *BlockOpts) (inboxtype.Middleware, error) {
	if w == nil {
		return nil, fmt.Errorf("middleware: Block needs a *controlrun.Watcher")
	}
	if p == nil {
		return nil, fmt.Errorf("middleware: Block needs a Parker")
	}
	log := slog.New(slog.DiscardHandler)
	if opts != nil && opts.Logger != nil {
		log = opts.Logger
	}
	return func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
		return func(ctx context.Context, d *inboxtype.Delivery) error {
			if d.Key == "" {
				return next(ctx, d)
			}
			b, ok := w.BlockedBy(d.Namespace, d.Key)
			if !ok {
				return next(ctx, d)
			}
			if fresh, still, err := w.Confirm(ctx, d.Namespace, d.Key); err == nil {
				if !still {
					return next(ctx, d)
				}
				b = fresh
			}
			if err := p.Park(ctx, d, b); err != nil {
				return retry.WithReason("park", retry.Retryable(fmt.Errorf("middleware: park blocked key %q: %w", d.Key, err)))
			}
			d.Transition(inboxtype.StatusParked, nil)
			log.LogAttrs(ctx, slog.LevelInfo, "middleware: blocked delivery parked",
				slog.String("queue", d.Queue), slog.String("namespace", d.Namespace), slog.String("key", d.Key),
				slog.String("pattern", b.Pattern), slog.String("reason", b.Reason))
			return retry.Duplicate(retry.SourceParked, fmt.Errorf("middleware: key %q blocked (%s), parked in %s",
				d.Key, b.Pattern, inboxtype.ParkedQueue(d.Queue)))
		}
	}, nil
}
