package inbox

import (
	"context"
	"log/slog"
	"math"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// DeadLetterObserver returns a inboxtype.Observer that records dead letters
// on the inbox: once the consumer has dead-lettered a delivery of a key
// (its copy confirmed in the DLQ and the original acked), the key's row
// becomes [RecordDead], with the copy's x-error text (reason: error) as
// last error and its attempt as attempts. Add it to
// consumer.Config.Observers:
//
//	Observers: []inboxtype.Observer{store.DeadLetterObserver()},
//
// A completed row and a claim of claim mode still processing are left
// alone, and so is a key without a row. A dead row is taken up again by a
// replay from the DLQ, like a failed one. Marking is best effort: the
// delivery is settled already, so a failed update (bounded by
// StoreConfig.CleanupTimeout) is logged and leaves the row as it was.
// Deliveries of handlers that do not use this store update nothing.
func (s *Store) DeadLetterObserver() inboxtype.Observer {
	return deadLetterObserver{s: s}
}

type deadLetterObserver struct {
	inboxtype.NopObserver
	s *Store
}

// OnOutcome marks the row of a dead-lettered delivery's key dead.
func (o deadLetterObserver) OnOutcome(d *inboxtype.Delivery, out inboxtype.Outcome) {
	if out.Action != inboxtype.ActionDeadLettered || out.Err != nil || d == nil || d.Key == "" || d.Namespace == "" || o.s.ready() != nil {
		return
	}
	if out.Decision.Reason == ReasonKeyDead {
		return // the key is dead already: its row keeps the error it died of
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.s.cfg.CleanupTimeout)
	defer cancel()
	attempt := int32(min(max(d.Attempt, 1), math.MaxInt32)) //nolint:gosec // bounded above
	if _, err := o.s.pool.Exec(ctx, o.s.sql.markDead, d.Namespace, d.Key, deadLetterText(out.Decision), attempt); err != nil {
		o.s.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "inbox: mark dead-lettered key dead",
			slog.String("namespace", d.Namespace), slog.String("key", d.Key), slog.Any("error", err))
	}
}

// deadLetterText is the dead-letter copy's x-error text for dec: its
// reason, then the error without the taxonomy's wrappers, bounded.
func deadLetterText(dec retry.Decision) string {
	reason := dec.Reason
	if reason == "" {
		reason = retry.ReasonError
	}
	msg := "unknown error"
	if err := unwrapTaxonomy(dec.Err); err != nil {
		msg = err.Error()
	}
	return boundText(reason + ": " + msg)
}

// unwrapTaxonomy peels the retry taxonomy's outer wrappers (permanent,
// retryable, a reason) off err: the reason already names them.
func unwrapTaxonomy(err error) error {
	for {
		switch e := err.(type) { //nolint:errorlint // only the outer wrappers are peeled, as x-error does
		case *retry.PermanentError:
			err = e.Err
		case *retry.RetryableError:
			err = e.Err
		case interface {
			RetryReason() string
			Unwrap() error
		}:
			inner := e.Unwrap()
			if inner == nil {
				return err
			}
			err = inner
		default:
			return err
		}
	}
}
