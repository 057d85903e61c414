package inboxtype

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Message is a decoded delivery handed to a typed [Handler].
type Message[T any] struct {
	// ID is the broker message id (informational only).
	ID string
	// Key is the idempotency key (from the payload's IdempotencyKey method).
	Key string
	// Namespace is the inbox namespace of the handler.
	Namespace string
	// Body is the decoded payload.
	Body T
	// Headers are the AMQP headers.
	Headers amqp.Table
	// Attempt is the 1-based attempt number.
	Attempt int
	// Redelivered is the broker's redelivered flag.
	Redelivered bool
	// Delivery is the untyped delivery this message was decoded from.
	Delivery *Delivery
}

// SetResult records v as the job's result: the inbox stores it on the
// key's row in the transaction of the effect (in claim mode, with
// Claim.Complete: call SetResult before it), and every later duplicate of
// the key gets the same bytes back (Delivery.Result), as does a reply to a
// request: byte for byte what this delivery holds. v is encoded with
// json.Marshal, except a json.RawMessage, which is the handler's own
// encoding and is kept as given (json.Marshal would compact it); it must
// be valid JSON. The last call before the commit wins; a handler that
// fails stores none. The inbox bounds its size
// (StoreConfig.MaxResultBytes): a larger result fails the delivery
// permanently. SetResult returns an error only if v cannot be encoded (or
// is a json.RawMessage that is not JSON); the result is then unchanged.
func (m *Message[T]) SetResult(v any) error {
	var raw []byte
	switch r := v.(type) {
	case json.RawMessage:
		switch {
		case r == nil:
			raw = []byte("null") // as json.Marshal encodes it
		case !json.Valid(r):
			return errors.New("inboxtype: result is not valid JSON")
		default:
			raw = bytes.Clone(r)
		}
	default:
		var err error
		if raw, err = json.Marshal(v); err != nil {
			return fmt.Errorf("inboxtype: encode result: %w", err)
		}
	}
	if m.Delivery == nil {
		m.Delivery = &Delivery{}
	}
	m.Delivery.Result = raw
	return nil
}

// Result returns the job's result (Delivery.Result): the one set with
// SetResult, or on a duplicate the one the first delivery stored. Nil when
// there is none.
func (m *Message[T]) Result() json.RawMessage {
	if m.Delivery == nil {
		return nil
	}
	return m.Delivery.Result
}

// Fingerprint returns the message's fingerprint: Delivery.Fingerprint when
// set (Register sets it on every delivery it decodes), else computed as
// Register would, from Body and the delivery's raw body (the JSON encoding
// of Body when the message has no delivery). The inbox records this value.
func (m *Message[T]) Fingerprint() []byte {
	if d := m.Delivery; d != nil {
		if d.Fingerprint != nil {
			return d.Fingerprint
		}
		return FingerprintOf(&m.Body, d.Body)
	}
	if f := fingerprinter(&m.Body); f != nil {
		return f.Fingerprint()
	}
	raw, err := json.Marshal(m.Body)
	if err != nil {
		return nil
	}
	return FingerprintOf(&m.Body, raw)
}

// FingerprintOf is the one fingerprint function: the fingerprint of the
// decoded payload v whose encoding is raw. It is v's own Fingerprint when T
// or *T implements [Fingerprinter], else the SHA-256 of raw. Register sets
// Delivery.Fingerprint with it.
func FingerprintOf[T any](v *T, raw []byte) []byte {
	if f := fingerprinter(v); f != nil {
		return f.Fingerprint()
	}
	sum := sha256.Sum256(raw)
	return sum[:]
}

// fingerprinter returns v as a Fingerprinter (through a value or pointer
// method), or nil.
func fingerprinter[T any](v *T) Fingerprinter {
	f, _ := any(v).(Fingerprinter)
	return f
}
