package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/retry"
)

// validate is what the worker does to a decoded payment: Validate, then
// the key check of every route (inboxtype.ValidKey).
func validate(p Payment) error {
	if err := p.Validate(); err != nil {
		return err
	}
	return inboxtype.ValidKey(p.IdempotencyKey())
}

func TestPaymentValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		p       Payment
		wantErr string
	}{
		{"valid", Payment{OrderID: "o-1", AmountCents: 1, Currency: "EUR"}, ""},
		{"lower-case currency", Payment{OrderID: "o-1", AmountCents: 1, Currency: "eur"}, ""},
		{"missing order", Payment{AmountCents: 1, Currency: "EUR"}, "order_id is missing"},
		{"zero amount", Payment{OrderID: "o", Currency: "EUR"}, "not positive"},
		{"negative amount", Payment{OrderID: "o", AmountCents: -3, Currency: "EUR"}, "not positive"},
		{"long currency", Payment{OrderID: "o", AmountCents: 1, Currency: "EURO"}, "three letters"},
		{"digit currency", Payment{OrderID: "o", AmountCents: 1, Currency: "E1R"}, "three letters"},
		{"non-ASCII currency", Payment{OrderID: "o", AmountCents: 1, Currency: "éa"}, "three letters"},
		{"largest amount", Payment{OrderID: "o", AmountCents: 1<<63 - 1, Currency: "EUR"}, ""},
		{"order_id of 200 bytes", Payment{OrderID: strings.Repeat("o", 200), AmountCents: 1, Currency: "EUR"}, ""},
		{"order_id of 201 bytes", Payment{OrderID: strings.Repeat("o", 201), AmountCents: 1, Currency: "EUR"}, "longer than 200"},
		{"order_id as sent, spaces kept", Payment{OrderID: " o ", AmountCents: 1, Currency: "EUR"}, ""},
		{"order_id unicode", Payment{OrderID: "zoë-€", AmountCents: 1, Currency: "EUR"}, ""},
		{"order_id only spaces", Payment{OrderID: "   ", AmountCents: 1, Currency: "EUR"}, "only whitespace"},
		{"order_id only unicode spaces", Payment{OrderID: "\u00a0\u3000", AmountCents: 1, Currency: "EUR"}, "only whitespace"},
		{"order_id CR LF", Payment{OrderID: "o\r\nX: 1", AmountCents: 1, Currency: "EUR"}, "control character"},
		{"order_id NUL", Payment{OrderID: "o\x00", AmountCents: 1, Currency: "EUR"}, "control character"},
		{"order_id tab", Payment{OrderID: "o\tp", AmountCents: 1, Currency: "EUR"}, "control character"},
		{"order_id DEL", Payment{OrderID: "o\x7f", AmountCents: 1, Currency: "EUR"}, "control character"},
		{"order_id U+001F", Payment{OrderID: "o\x1f", AmountCents: 1, Currency: "EUR"}, "control character"},
		{"order_id invalid UTF-8", Payment{OrderID: "o\xff", AmountCents: 1, Currency: "EUR"}, "UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := validate(tt.p)
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
	require.Equal(t, "payment:o-7", Payment{OrderID: "o-7"}.IdempotencyKey())
}

// TestPaymentInput runs raw bodies through what the worker's Register does
// to them (decode with the JSON codec, Validate, check the key): the
// contract's "invalid input" is exactly what fails.
func TestPaymentInput(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		body string
		want string // in the error; "" for valid input
	}{
		{"valid", `{"order_id":"o-1","amount_cents":1299,"currency":"EUR"}`, ""},
		{"unknown extra fields ignored", `{"order_id":"o-1","amount_cents":1,"currency":"EUR","note":{"x":[1]}}`, ""},
		{"largest amount", `{"order_id":"o-1","amount_cents":9223372036854775807,"currency":"EUR"}`, ""},
		{"order_id spaces kept", `{"order_id":" o-1 ","amount_cents":1,"currency":"EUR"}`, ""},
		{"not valid UTF-8", "{\"order_id\":\"o\xff\",\"amount_cents\":1,\"currency\":\"EUR\"}", "UTF-8"},
		{"not valid UTF-8 in an ignored field", "{\"order_id\":\"o\",\"amount_cents\":1,\"currency\":\"EUR\",\"n\":\"\xfe\"}", "UTF-8"},
		{"not JSON", `{not json`, "invalid character"},
		{"empty body", ``, "unexpected end"},
		{"an array", `[{"order_id":"o","amount_cents":1,"currency":"EUR"}]`, "cannot unmarshal array"},
		{"a string", `"o-1"`, "cannot unmarshal string"},
		{"a number", `7`, "cannot unmarshal number"},
		{"JSON null", `null`, "order_id is missing"},
		{"empty object", `{}`, "order_id is missing"},
		{"order_id missing", `{"amount_cents":1,"currency":"EUR"}`, "order_id is missing"},
		{"order_id null", `{"order_id":null,"amount_cents":1,"currency":"EUR"}`, "order_id is missing"},
		{"order_id a number", `{"order_id":7,"amount_cents":1,"currency":"EUR"}`, "cannot unmarshal number"},
		{"order_id only whitespace", `{"order_id":" \t ","amount_cents":1,"currency":"EUR"}`, "only whitespace"},
		{"order_id escaped NUL", `{"order_id":"o\u0000","amount_cents":1,"currency":"EUR"}`, "control character"},
		{"order_id CR LF", `{"order_id":"o\r\n","amount_cents":1,"currency":"EUR"}`, "control character"},
		{"amount_cents missing", `{"order_id":"o","currency":"EUR"}`, "amount_cents 0 is missing"},
		{"amount_cents null", `{"order_id":"o","amount_cents":null,"currency":"EUR"}`, "amount_cents 0 is missing"},
		{"amount_cents zero", `{"order_id":"o","amount_cents":0,"currency":"EUR"}`, "not positive"},
		{"amount_cents negative", `{"order_id":"o","amount_cents":-5,"currency":"EUR"}`, "not positive"},
		{"amount_cents a float", `{"order_id":"o","amount_cents":1.5,"currency":"EUR"}`, "cannot unmarshal number 1.5"},
		{"amount_cents an exponent", `{"order_id":"o","amount_cents":1e2,"currency":"EUR"}`, "cannot unmarshal number 1e2"},
		{"amount_cents 2^63", `{"order_id":"o","amount_cents":9223372036854775808,"currency":"EUR"}`, "cannot unmarshal number"},
		{"amount_cents a string", `{"order_id":"o","amount_cents":"1","currency":"EUR"}`, "cannot unmarshal string"},
		{"currency missing", `{"order_id":"o","amount_cents":1}`, "three letters"},
		{"currency null", `{"order_id":"o","amount_cents":1,"currency":null}`, "three letters"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var p Payment
			err := consumer.JSON.Decode([]byte(tt.body), &p)
			if err == nil {
				err = validate(p)
			}
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.want)
		})
	}
}

// Every gateway answer is classified: 2xx charged (its id returned), 5xx,
// 408 and 429 (after its Retry-After) retried, other statuses permanent,
// each with its reason.
func TestGatewayClassifiesAnswers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code       int
		retryAfter string
		kind       retry.Kind
		reason     string
		delay      time.Duration
	}{
		{http.StatusOK, "", retry.KindSucceeded, "", 0},
		{http.StatusCreated, "", retry.KindSucceeded, "", 0},
		{http.StatusInternalServerError, "", retry.KindRetry, "gateway_5xx", 0},
		{http.StatusServiceUnavailable, "", retry.KindRetry, "gateway_5xx", 0},
		{http.StatusRequestTimeout, "", retry.KindRetry, "gateway_timeout", 0},
		{http.StatusTooManyRequests, "", retry.KindRetry, "gateway_429", 0},
		{http.StatusTooManyRequests, "7", retry.KindRetry, "gateway_429", 7 * time.Second},
		{http.StatusTooManyRequests, "86400", retry.KindRetry, "gateway_429", 10 * time.Minute},
		{http.StatusBadRequest, "", retry.KindPermanent, "gateway_4xx", 0},
		{http.StatusUnprocessableEntity, "", retry.KindPermanent, "gateway_4xx", 0},
		{http.StatusConflict, "", retry.KindPermanent, "gateway_4xx", 0},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d %s", tt.code, tt.retryAfter), func(t *testing.T) {
			t.Parallel()
			srv := newLoopbackServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Retry-After", tt.retryAfter)
				w.WriteHeader(tt.code)
				_, _ = w.Write([]byte(`{"id":"ch_1"}`))
			}))
			id, err := (&Gateway{BaseURL: srv}).Charge(t.Context(), "payment:o-1", Payment{OrderID: "o-1", AmountCents: 1, Currency: "EUR"})
			d := retry.Classify(err)
			require.Equal(t, tt.kind, d.Kind, "%v", err)
			require.Equal(t, tt.reason, d.Reason)
			require.Equal(t, tt.delay, d.Delay, "Retry-After is honoured, up to 10m")
			if tt.kind == retry.KindSucceeded {
				require.Equal(t, "ch_1", id)
			}
		})
	}
}

// A gateway that does not answer in time, or at all, is retried with its
// reason.
func TestGatewayTimeoutAndNetworkErrors(t *testing.T) {
	t.Parallel()
	hang := make(chan struct{})
	slow := newLoopbackServer(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-hang }))
	t.Cleanup(func() { close(hang) })
	p := Payment{OrderID: "o-1", AmountCents: 1, Currency: "EUR"}
	_, err := (&Gateway{BaseURL: slow, Timeout: 100 * time.Millisecond}).Charge(t.Context(), p.IdempotencyKey(), p)
	d := retry.Classify(err)
	require.Equal(t, retry.KindRetry, d.Kind, "%v", err)
	require.Equal(t, "gateway_timeout", d.Reason)

	_, err = (&Gateway{BaseURL: "http://" + freeAddr(t)}).Charge(t.Context(), p.IdempotencyKey(), p)
	d = retry.Classify(err)
	require.Equal(t, retry.KindRetry, d.Kind, "%v", err)
	require.Equal(t, "gateway_network", d.Reason)
}

// A request that can never succeed (a header value net/http refuses, a
// URL it cannot send to) is permanent, refused before any network I/O,
// never a gateway_network retry.
func TestGatewayInvalidRequestIsPermanent(t *testing.T) {
	t.Parallel()
	gw := &gateway{calls: map[string][]string{}, paid: map[string]int{}}
	srv := newLoopbackServer(t, gw)
	p := Payment{OrderID: "o-1", AmountCents: 100, Currency: "EUR"}
	tests := []struct {
		name    string
		baseURL string
		key     string
	}{
		{"CR LF in the key", srv, "payment:o\r\nX-Injected: 1"},
		{"LF in the key", srv, "payment:o\nx"},
		{"NUL in the key", srv, "payment:o\x00"},
		{"DEL in the key", srv, "payment:o\x7f"},
		{"unparsable URL", "http://[::1", "payment:o-1"},
		{"unsupported scheme", "ftp://127.0.0.1:1", "payment:o-1"},
		{"no host", "http://", "payment:o-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := (&Gateway{BaseURL: tt.baseURL, Timeout: 5 * time.Second}).Charge(t.Context(), tt.key, p)
			d := retry.Classify(err)
			require.Equal(t, retry.KindPermanent, d.Kind, "%v", err)
			require.Equal(t, retry.ReasonInvalid, d.Reason, "%v", err)
		})
	}
	calls, _ := gw.snapshot()
	require.Empty(t, calls, "nothing reached the gateway")

	// A tab is a valid header value: the charge goes through.
	_, err := (&Gateway{BaseURL: srv}).Charge(t.Context(), "payment:o\tp", p)
	require.NoError(t, err)
}

func TestConfigFromEnv(t *testing.T) {
	t.Parallel()
	env := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	c, err := loadConfig(env())
	require.NoError(t, err)
	require.Equal(t, config{
		AMQPURL: "amqp://guest:guest@127.0.0.1:5672/", DatabaseURL: "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		RedisURL: "redis://127.0.0.1:6379/0", Queue: "payments.requested", Events: "payments.events",
		Lock: "auto", LockTTL: 30 * time.Second, Concurrency: 8, GroupCommit: "off", FaultEvents: "off",
		MetricsAddr: "127.0.0.1:9464", ConnectTimeout: 30 * time.Second, QueueType: inboxmq.Quorum, DeliveryLimit: 20,
		Breaker: "off", BreakerWindow: 30 * time.Second, BreakerThreshold: 0.5, BreakerMinCalls: 10, BreakerCoolDown: 15 * time.Second,
		GatewayWorkers: 1,
	}, c, "the README's defaults")
	c, err = loadConfig(env("QUEUE_TYPE", "classic", "DELIVERY_LIMIT", "5", "LOCK_TTL", "", "PAYMENT_QUEUE", ""))
	require.NoError(t, err)
	require.Equal(t, inboxmq.Classic, c.QueueType)
	require.Equal(t, 5, c.DeliveryLimit)
	require.Equal(t, 30*time.Second, c.LockTTL, "an empty variable is unset")
	require.Equal(t, "payments.requested", c.Queue)

	c, err = loadConfig(env("LOCK_TTL", "2s", "WORKER_CONCURRENCY", "3", "PAYMENT_QUEUE", "q.1", "GATEWAY_URL", "http://127.0.0.1:1",
		"GROUP_COMMIT", "on", "FAULT_EVENTS", "on", "CONNECT_TIMEOUT", "5s", "LOCK", "on"))
	require.NoError(t, err)
	require.Equal(t, 2*time.Second, c.LockTTL)
	require.Equal(t, 3, c.Concurrency)
	require.Equal(t, "q.1", c.Queue)
	require.Equal(t, "on", c.GroupCommit)
	require.Equal(t, "on", c.FaultEvents)
	require.Equal(t, "on", c.Lock)
	require.Equal(t, 5*time.Second, c.ConnectTimeout)
	c, err = loadConfig(env("GROUP_COMMIT", "on"))
	require.NoError(t, err)
	require.Zero(t, c.Concurrency, "with group commit the route picks the concurrency")

	c, err = loadConfig(env("BREAKER", "on", "BREAKER_WINDOW", "10s", "BREAKER_THRESHOLD", "0.25",
		"BREAKER_MIN_CALLS", "4", "BREAKER_COOLDOWN", "3s", "GATEWAY_RATE_LIMIT", "50", "GATEWAY_WORKERS", "3"))
	require.NoError(t, err)
	require.Equal(t, "on", c.Breaker)
	require.Equal(t, 10*time.Second, c.BreakerWindow)
	require.InDelta(t, 0.25, c.BreakerThreshold, 0)
	require.Equal(t, 4, c.BreakerMinCalls)
	require.Equal(t, 3*time.Second, c.BreakerCoolDown)
	require.InDelta(t, 50, c.RateLimit, 0)
	require.Equal(t, 3, c.GatewayWorkers)

	for _, bad := range [][]string{
		{"BREAKER", "yes"}, {"BREAKER_WINDOW", "soon"}, {"BREAKER_WINDOW", "0s"}, {"BREAKER_COOLDOWN", "-1s"},
		{"BREAKER_THRESHOLD", "2"}, {"BREAKER_THRESHOLD", "0"}, {"BREAKER_MIN_CALLS", "0"}, {"GATEWAY_RATE_LIMIT", "-1"},
		{"GATEWAY_RATE_LIMIT", "fast"}, {"GATEWAY_WORKERS", "0"},
		{"LOCK_TTL", "soon"}, {"LOCK_TTL", "-1s"}, {"LOCK_TTL", "1ns"}, {"LOCK_TTL", "1ms"}, {"LOCK_TTL", "999ms"},
		{"LOCK_TTL", "1h"}, {"LOCK_TTL", "10m1s"}, {"WORKER_CONCURRENCY", "0"}, {"WORKER_CONCURRENCY", "many"},
		{"PAYMENT_QUEUE", "bad queue"}, {"PAYMENT_EVENTS_EXCHANGE", "bad/exchange"}, {"GATEWAY_URL", "ftp://x"},
		{"GATEWAY_URL", "http://"}, {"GROUP_COMMIT", "yes"}, {"FAULT_EVENTS", "yes"}, {"CONNECT_TIMEOUT", "0s"},
		{"CONNECT_TIMEOUT", "soon"}, {"QUEUE_TYPE", "Quorum"}, {"QUEUE_TYPE", "mirrored"}, {"DELIVERY_LIMIT", "0"},
		{"DELIVERY_LIMIT", "-3"}, {"DELIVERY_LIMIT", "many"}, {"LOCK", "yes"},
	} {
		_, err := loadConfig(env(bad...))
		require.ErrorContains(t, err, bad[0]+": want ", "%v: the error names the variable and what it wants", bad)
	}
	for v, want := range map[string]string{"": "auto", "auto": "auto", "on": "on", "off": "off"} {
		c, err := loadConfig(env("LOCK", v))
		require.NoError(t, err, "LOCK=%s", v)
		require.Equal(t, want, c.Lock, "LOCK=%s", v)
	}
	_, err = loadConfig(env("LOCK", "yes"))
	require.EqualError(t, err, `LOCK: want auto, on or off`)
	_, err = loadConfig(env("QUEUE_TYPE", "stream"))
	require.EqualError(t, err, `QUEUE_TYPE: want quorum or classic`)
	for v, want := range map[string]time.Duration{"1s": time.Second, "10m": 10 * time.Minute} {
		c, err := loadConfig(env("LOCK_TTL", v))
		require.NoError(t, err, "LOCK_TTL=%s is in range", v)
		require.Equal(t, want, c.LockTTL)
	}
	for _, v := range []string{"1h", "soon"} {
		_, err = loadConfig(env("LOCK_TTL", v))
		require.EqualError(t, err, `LOCK_TTL: want a Go duration from 1s to 10m0s, such as 30s`, "LOCK_TTL=%s", v)
	}
	_, err = loadConfig(env("GATEWAY_URL", "http//user:secret@"))
	require.EqualError(t, err, `GATEWAY_URL: want an http:// or https:// URL with a host`)
}

func TestPaymentFingerprint(t *testing.T) {
	t.Parallel()
	p := Payment{OrderID: "o-1", AmountCents: 500, Currency: "EUR"}
	require.Equal(t, p.Fingerprint(), Payment{OrderID: "o-1", AmountCents: 500, Currency: "eur"}.Fingerprint())
	require.NotEqual(t, p.Fingerprint(), Payment{OrderID: "o-1", AmountCents: 501, Currency: "EUR"}.Fingerprint())
	require.NotEqual(t, p.Fingerprint(), Payment{OrderID: "o-1", AmountCents: 500, Currency: "USD"}.Fingerprint())
	require.NotEqual(t, p.Fingerprint(), Payment{OrderID: "o-2", AmountCents: 500, Currency: "EUR"}.Fingerprint())
}
