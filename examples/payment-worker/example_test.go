package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/inboxmq/inboxmq/retry"
)

// A payment's idempotency key is its business identity; invalid payments
// are refused before any write.
func ExamplePayment() {
	p := Payment{OrderID: "A-1001", AmountCents: 1299, Currency: "EUR"}
	fmt.Println(p.IdempotencyKey(), p.Validate() == nil)

	bad := Payment{OrderID: "A-1002", AmountCents: 0, Currency: "EURO"}
	fmt.Println(bad.Validate())
	// Output:
	// payment:A-1001 true
	// amount_cents 0 is missing or not positive
	// currency "EURO" is not three letters
}

// Every charge carries the idempotency key, and the gateway's answer is
// classified for the consumer: 2xx charged, 5xx retried, other 4xx
// permanent.
func ExampleGateway_Charge() {
	status := http.StatusServiceUnavailable
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println(r.Method, r.URL.Path, "Idempotency-Key:", r.Header.Get("Idempotency-Key"))
		w.WriteHeader(status)
	}))
	defer srv.Close()

	gw := &Gateway{BaseURL: srv.URL}
	p := Payment{OrderID: "A-1001", AmountCents: 1299, Currency: "EUR"}
	for _, s := range []int{http.StatusServiceUnavailable, http.StatusPaymentRequired, http.StatusCreated} {
		status = s
		_, err := gw.Charge(context.Background(), p.IdempotencyKey(), p)
		d := retry.Classify(err)
		fmt.Println(s, "->", d.Kind, d.Reason)
	}
	// Output:
	// POST /charges Idempotency-Key: payment:A-1001
	// 503 -> retry gateway_5xx
	// POST /charges Idempotency-Key: payment:A-1001
	// 402 -> permanent gateway_4xx
	// POST /charges Idempotency-Key: payment:A-1001
	// 201 -> succeeded
}
