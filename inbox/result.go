package inbox

import (
	"fmt"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// Results: a handler records its job's result with
// inboxtype.Message.SetResult; the inbox stores it on the key's row in the
// transaction of the effect, and hands it to every later duplicate of the
// key (Delivery.Result). In transactional mode the results of a
// transaction's deliveries are written in one statement sent with its
// COMMIT, only for the deliveries whose handlers succeeded (in claim mode,
// by the completion's statement), so a handler that fails stores none, and
// each delivery of a batch stores its own.

// ReasonResultTooLarge: the handler's result is larger than
// StoreConfig.MaxResultBytes; the delivery fails permanently and nothing
// of it commits.
const ReasonResultTooLarge = "result_too_large"

// defaultMaxResultBytes is StoreConfig.MaxResultBytes's default.
const defaultMaxResultBytes = 64 << 10

// checkResult refuses a result larger than MaxResultBytes, permanently.
func (s *Store) checkResult(namespace, key string, raw []byte) error {
	if len(raw) > s.cfg.MaxResultBytes {
		return retry.Permanent(retry.WithReason(ReasonResultTooLarge, fmt.Errorf(
			"inbox: result of key %q of namespace %q is %d bytes, more than MaxResultBytes %d",
			key, namespace, len(raw), s.cfg.MaxResultBytes)))
	}
	return nil
}

// deferResult checks raw, the handler's result, and leaves it on u for
// the COMMIT's round trip (commitResults), which writes the results of all
// the transaction's deliveries in one statement. A nil raw stores nothing.
func (s *Store) deferResult(u *unit, raw []byte) error {
	u.pending = nil
	if raw == nil {
		return nil
	}
	if err := s.checkResult(u.namespace, u.key, raw); err != nil {
		return err
	}
	u.pending = raw
	return nil
}

// takeResult returns d's result and clears it, so that a later run of the
// same delivery (an in-process retry) starts without one.
func takeResult(d *inboxtype.Delivery) []byte {
	if d == nil {
		return nil
	}
	r := d.Result
	d.Result = nil
	return r
}

// keepResult leaves on d, once the inbox has ruled on it, the result its
// key's row holds, so that a reply to d carries the row's bytes: after
// success (err nil) the bytes d's handler stored (nil for none; a result
// set after the commit was not stored and is dropped), on a duplicate the
// ones the first delivery stored (first). Any other error leaves d alone.
func keepResult(d *inboxtype.Delivery, stored, first []byte, err error) {
	switch {
	case d == nil:
	case err == nil:
		d.Result = stored
	case first != nil && retry.Classify(err).Kind == retry.KindDuplicate:
		d.Result = first
	}
}
