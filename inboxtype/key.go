package inboxtype

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Keyer is implemented by payloads that carry a business identity. The
// returned key (such as "payment:" + OrderID) is the idempotency key; it must
// be the same for every copy, retry and replay of the job, and never derived
// from the broker's message id. Register accepts a T whose value or pointer
// implements Keyer; a key that [ValidKey] refuses (empty, too long, a
// control character, only whitespace) makes the delivery fail permanently
// with reason "invalid". The key is used exactly as returned: never trimmed
// or normalised.
type Keyer interface {
	IdempotencyKey() string
}

// MaxKeyLen is the longest idempotency key [ValidKey] accepts, in bytes.
const MaxKeyLen = 512

// ValidKey reports why key cannot be an idempotency key, or nil if it can:
// a key is 1 to [MaxKeyLen] bytes of valid UTF-8, has no control character
// (U+0000 to U+001F, U+007F) and is not only whitespace. Register applies
// it to every key; producers may call it to refuse such keys before
// publishing. Keys travel in AMQP headers, log lines, Redis keys, SQL and
// HTTP headers, where control characters break or forge fields.
func ValidKey(key string) error {
	switch {
	case key == "":
		return errors.New("inboxtype: the idempotency key is empty")
	case len(key) > MaxKeyLen:
		return fmt.Errorf("inboxtype: the idempotency key is %d bytes, longer than %d", len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return errors.New("inboxtype: the idempotency key is not valid UTF-8")
	case strings.TrimSpace(key) == "":
		return errors.New("inboxtype: the idempotency key is only whitespace")
	}
	if i := strings.IndexFunc(key, isControl); i >= 0 {
		return fmt.Errorf("inboxtype: the idempotency key has a control character (%U) at byte %d", key[i], i)
	}
	return nil
}

// isControl reports the C0 control characters and DEL.
func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// Fingerprinter is implemented by payloads that choose their own
// fingerprint: the bytes that tell "the same job again" from "another job
// reusing the key". Without it the fingerprint is the SHA-256 of the raw
// body. Register sets it on Delivery.Fingerprint; the inbox and the
// completed-cache compare it, so a reused key with another fingerprint is
// a key conflict, never a duplicate. It must be the same for every copy of
// one job (derive it from the decoded fields, not from their encoding) and
// should not be empty.
type Fingerprinter interface {
	Fingerprint() []byte
}

// Validator is implemented by payloads that can check themselves after
// decoding. A non-nil error dead-letters the delivery (reason "invalid").
type Validator interface {
	Validate() error
}
