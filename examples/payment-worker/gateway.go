package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/inboxmq/inboxmq/retry"
)

// Reasons the gateway client attaches to its errors (bounded metric labels).
const (
	reasonGateway5xx     = "gateway_5xx"
	reasonGateway4xx     = "gateway_4xx"
	reasonGatewayTimeout = "gateway_timeout"
	reasonGateway429     = "gateway_429"
	reasonGatewayNetwork = "gateway_network"
)

// Gateway charges payments through an HTTP payment gateway. Every call
// carries the idempotency key, so a charge repeated after a crash is
// recognised by the gateway and not taken twice.
type Gateway struct {
	// BaseURL is the gateway's base URL; charges go to BaseURL + "/charges".
	BaseURL string
	// Client is the HTTP client. Defaults to a client with Timeout.
	Client *http.Client
	// Timeout bounds one charge call. Defaults to 10s.
	Timeout time.Duration
}

type chargeRequest struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// Charge posts the charge for p with header Idempotency-Key: key. On 2xx
// it returns the charge's id (the "id" field of the gateway's JSON answer,
// "" if it sends none); a retryable error (retry.After) on 5xx, 408, 429, a
// timeout or a network error; and a permanent error (retry.Permanent) on any
// other status. A request that can never be sent (a URL that does not
// parse or is not http(s) with a host, a header value net/http refuses) is
// permanent with reason "invalid", before any network I/O.
func (g *Gateway) Charge(ctx context.Context, key string, p Payment) (string, error) {
	timeout := g.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	client := g.Client
	if client == nil {
		client = &http.Client{Timeout: timeout}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	body, err := json.Marshal(chargeRequest{OrderID: p.OrderID, AmountCents: p.AmountCents, Currency: p.Currency})
	if err != nil {
		return "", retry.Permanent(fmt.Errorf("gateway: encode charge: %w", err))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(g.BaseURL, "/")+"/charges", bytes.NewReader(body))
	if err != nil {
		return "", invalidRequest(fmt.Errorf("gateway: build request: %w", err))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	if err := sendable(req); err != nil {
		return "", invalidRequest(fmt.Errorf("gateway: charge %s: %w", p.OrderID, err))
	}

	resp, err := client.Do(req)
	if err != nil {
		// The caller's own cancellation (shutdown, lost lease) is not a
		// gateway failure: hand it back unchanged for the consumer to see.
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.DeadlineExceeded) {
			return "", fmt.Errorf("gateway: charge %s: %w", p.OrderID, err)
		}
		var uerr interface{ Timeout() bool }
		if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &uerr) && uerr.Timeout()) {
			return "", retry.WithReason(reasonGatewayTimeout, retry.Retryable(fmt.Errorf("gateway: charge %s timed out: %w", p.OrderID, err)))
		}
		return "", retry.WithReason(reasonGatewayNetwork, retry.Retryable(fmt.Errorf("gateway: charge %s: %w", p.OrderID, err)))
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if err := classifyStatus(resp.StatusCode, resp.Header.Get("Retry-After"), p.OrderID, strings.TrimSpace(string(msg))); err != nil {
		return "", err
	}
	var answer struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(msg, &answer) // an answer without an id is still a charge
	return answer.ID, nil
}

// invalidRequest marks err, a request that can never be sent, permanent.
func invalidRequest(err error) error {
	return retry.WithReason(retry.ReasonInvalid, retry.Permanent(err))
}

// sendable checks what net/http would refuse before any network I/O, and
// report only as an untyped error from Do: the URL's scheme and host, and
// header values (no control character other than a tab).
func sendable(req *http.Request) error {
	if (req.URL.Scheme != "http" && req.URL.Scheme != "https") || req.URL.Host == "" {
		return fmt.Errorf("URL %s: want http:// or https:// with a host", req.URL.Redacted())
	}
	for name, values := range req.Header {
		for _, v := range values {
			if strings.ContainsFunc(v, func(r rune) bool { return r != '\t' && isControl(r) }) {
				return fmt.Errorf("header %s has a control character", name)
			}
		}
	}
	return nil
}

// classifyStatus maps a gateway answer to the retry taxonomy.
func classifyStatus(code int, retryAfter, orderID, body string) error {
	err := fmt.Errorf("gateway: charge %s: HTTP %d %s", orderID, code, body)
	switch {
	case code >= 200 && code < 300:
		return nil
	case code == http.StatusTooManyRequests:
		return retry.WithReason(reasonGateway429, retry.After(parseRetryAfter(retryAfter), err))
	case code == http.StatusRequestTimeout:
		return retry.WithReason(reasonGatewayTimeout, retry.Retryable(err))
	case code >= 500:
		return retry.WithReason(reasonGateway5xx, retry.Retryable(err))
	default:
		return retry.WithReason(reasonGateway4xx, retry.Permanent(err))
	}
}

// parseRetryAfter reads a Retry-After header in seconds (0 when absent or
// malformed, which lets the retry policy choose).
func parseRetryAfter(v string) time.Duration {
	var s int
	if _, err := fmt.Sscanf(v, "%d", &s); err != nil || s < 0 {
		return 0
	}
	return min(time.Duration(s)*time.Second, 10*time.Minute)
}
