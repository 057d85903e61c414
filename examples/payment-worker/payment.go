package main

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
)

// Payment is the payload of a payment request: the business identity is
// OrderID, so every copy of one order has the same idempotency key whatever
// its broker message id.
type Payment struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// IdempotencyKey implements consumer.Keyer: "payment:" + OrderID. The same
// key goes to the payment gateway as the Idempotency-Key header.
func (p Payment) IdempotencyKey() string { return "payment:" + p.OrderID }

// Fingerprint implements consumer.Fingerprinter: the hash of the payment's
// fields rather than of the raw body, so a producer that re-encodes the same
// order (other field order, other whitespace, an extra field) sends a
// duplicate, while the same order_id with another amount or currency is a
// key conflict and is dead-lettered instead of being silently acked.
func (p Payment) Fingerprint() []byte {
	sum := sha256.Sum256(fmt.Appendf(nil, "%d:%s|%d|%s", len(p.OrderID), p.OrderID, p.AmountCents, strings.ToUpper(p.Currency)))
	return sum[:]
}

// Validate implements consumer.Validator. An invalid payment fails
// permanently: it is dead-lettered with the reason and writes nothing.
func (p Payment) Validate() error {
	var errs []error
	if p.OrderID == "" {
		errs = append(errs, errors.New("order_id is missing"))
	}
	if len(p.OrderID) > 200 {
		errs = append(errs, errors.New("order_id is longer than 200 bytes"))
	}
	if p.AmountCents <= 0 {
		errs = append(errs, fmt.Errorf("amount_cents %d is not positive", p.AmountCents))
	}
	if !validCurrency(p.Currency) {
		errs = append(errs, fmt.Errorf("currency %q is not three letters", p.Currency))
	}
	return errors.Join(errs...)
}

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
