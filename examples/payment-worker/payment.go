package main

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Payment is the payload of a payment request: the business identity is
// OrderID, so every copy of one order has the same idempotency key whatever
// its broker message id.
type Payment struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// IdempotencyKey implements inboxtype.Keyer: "payment:" + OrderID. The same
// key goes to the payment gateway as the Idempotency-Key header.
func (p Payment) IdempotencyKey() string { return "payment:" + p.OrderID }

// Fingerprint implements inboxtype.Fingerprinter: the hash of the payment's
// fields rather than of the raw body, so a producer that re-encodes the same
// order (other field order, other whitespace, an extra field) sends a
// duplicate, while the same order_id with another amount or currency is a
// key conflict and is dead-lettered instead of being silently acked.
func (p Payment) Fingerprint() []byte {
	sum := sha256.Sum256(fmt.Appendf(nil, "%d:%s|%d|%s", len(p.OrderID), p.OrderID, p.AmountCents, strings.ToUpper(p.Currency)))
	return sum[:]
}

// maxOrderIDLen is the longest order_id accepted, in bytes.
const maxOrderIDLen = 200

// Validate implements inboxtype.Validator. An invalid payment fails
// permanently: it is dead-lettered with the reason and writes nothing.
// order_id is 1–200 bytes of UTF-8 with no control character (U+0000 to
// U+001F, U+007F) and not only whitespace, taken exactly as sent (never
// trimmed); amount_cents is from 1 to 2^63−1 (a float or a larger number
// does not decode); currency is three letters. A missing or null field
// reads as its zero value and so is invalid.
func (p Payment) Validate() error {
	var errs []error
	switch {
	case p.OrderID == "":
		errs = append(errs, errors.New("order_id is missing"))
	case len(p.OrderID) > maxOrderIDLen:
		errs = append(errs, fmt.Errorf("order_id is %d bytes, longer than %d", len(p.OrderID), maxOrderIDLen))
	case !utf8.ValidString(p.OrderID):
		errs = append(errs, errors.New("order_id is not valid UTF-8"))
	case strings.TrimSpace(p.OrderID) == "":
		errs = append(errs, errors.New("order_id is only whitespace"))
	case strings.ContainsFunc(p.OrderID, isControl):
		errs = append(errs, errors.New("order_id has a control character"))
	}
	if p.AmountCents <= 0 {
		errs = append(errs, fmt.Errorf("amount_cents %d is missing or not positive", p.AmountCents))
	}
	if !validCurrency(p.Currency) {
		errs = append(errs, fmt.Errorf("currency %q is not three letters", p.Currency))
	}
	return errors.Join(errs...)
}

// isControl reports the C0 control characters and DEL.
func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

func validCurrency(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if (c < 'A' || c > 'Z') && (c < 'a' || c > 'z') {
			return false
		}
	}
	return true
}
