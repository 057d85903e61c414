package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/retry"
)

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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.p.Validate()
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
	require.Equal(t, "payment:o-7", Payment{OrderID: "o-7"}.IdempotencyKey())
}

func TestClassifyStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code   int
		kind   retry.Kind
		reason string
	}{
		{http.StatusOK, retry.KindSucceeded, ""},
		{http.StatusCreated, retry.KindSucceeded, ""},
		{http.StatusInternalServerError, retry.KindRetry, reasonGateway5xx},
		{http.StatusServiceUnavailable, retry.KindRetry, reasonGateway5xx},
		{http.StatusRequestTimeout, retry.KindRetry, reasonGatewayTimeout},
		{http.StatusTooManyRequests, retry.KindRetry, reasonGateway429},
		{http.StatusBadRequest, retry.KindPermanent, reasonGateway4xx},
		{http.StatusUnprocessableEntity, retry.KindPermanent, reasonGateway4xx},
		{http.StatusConflict, retry.KindPermanent, reasonGateway4xx},
	}
	for _, tt := range tests {
		t.Run(http.StatusText(tt.code), func(t *testing.T) {
			t.Parallel()
			d := retry.Classify(classifyStatus(tt.code, "", "o-1", "body"))
			require.Equal(t, tt.kind, d.Kind)
			require.Equal(t, tt.reason, d.Reason)
		})
	}
	d := retry.Classify(classifyStatus(http.StatusTooManyRequests, "7", "o-1", ""))
	require.Equal(t, 7*time.Second, d.Delay, "Retry-After is honoured")
}

func TestConfigFromEnv(t *testing.T) {
	t.Parallel()
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	c, err := configFromEnv(env())
	require.NoError(t, err)
	require.Equal(t, config{
		AMQPURL: defaultAMQPURL, DatabaseURL: defaultDatabaseURL, RedisURL: defaultRedisURL,
		Queue: defaultQueue, LockTTL: 30 * time.Second, Concurrency: 8, MetricsAddr: defaultMetricsAddr,
		EventsExchange: defaultEvents,
	}, c)

	c, err = configFromEnv(env("LOCK_TTL", "2s", "WORKER_CONCURRENCY", "3", "PAYMENT_QUEUE", "q.1", "GATEWAY_URL", "http://127.0.0.1:1", "GROUP_COMMIT", "on"))
	require.NoError(t, err)
	require.Equal(t, 2*time.Second, c.LockTTL)
	require.Equal(t, 3, c.Concurrency)
	require.Equal(t, "q.1", c.Queue)
	require.True(t, c.GroupCommit)

	for _, bad := range [][]string{
		{"LOCK_TTL", "soon"}, {"LOCK_TTL", "-1s"}, {"LOCK_TTL", "1ns"}, {"LOCK_TTL", "1ms"}, {"LOCK_TTL", "999ms"},
		{"LOCK_TTL", "1h"}, {"LOCK_TTL", "10m1s"}, {"WORKER_CONCURRENCY", "0"},
		{"PAYMENT_QUEUE", "bad queue"}, {"GATEWAY_URL", "ftp://x"}, {"GROUP_COMMIT", "yes"},
	} {
		_, err := configFromEnv(env(bad...))
		require.Error(t, err, "%v", bad)
	}
	for v, want := range map[string]time.Duration{"1s": time.Second, "10m": 10 * time.Minute} {
		c, err := configFromEnv(env("LOCK_TTL", v))
		require.NoError(t, err, "LOCK_TTL=%s is in range", v)
		require.Equal(t, want, c.LockTTL)
	}
	_, err = configFromEnv(env("LOCK_TTL", "1h"))
	require.EqualError(t, err, `LOCK_TTL "1h": want a Go duration from 1s to 10m0s, such as 30s`)
	_, err = configFromEnv(env("GATEWAY_URL", "http//user:secret@"))
	require.Error(t, err)
	require.NotContains(t, err.Error(), "secret", "errors never show a password")
}

func TestSumMetric(t *testing.T) {
	t.Parallel()
	text := `# HELP inboxmq_duplicate_detected_total Duplicates.
# TYPE inboxmq_duplicate_detected_total counter
inboxmq_duplicate_detected_total{queue="q",source="inbox"} 3
inboxmq_duplicate_detected_total{queue="q",source="cache"} 2
inboxmq_job_retry_total{queue="q"} 9
other 1
`
	v, err := sumMetric(strings.NewReader(text), "duplicate_detected_total")
	require.NoError(t, err)
	require.InDelta(t, 5.0, v, 0)
}

func TestBurst(t *testing.T) {
	t.Parallel()
	msgs, s := burst("run", 50, 3, 5)
	require.Equal(t, 50, s.UniqueOrders)
	require.Equal(t, 5, s.Invalid)
	require.Equal(t, s.ValidCopies+s.Invalid, s.Published)
	require.Len(t, msgs, s.Published)
	require.GreaterOrEqual(t, s.ValidCopies, 50)
	require.LessOrEqual(t, s.ValidCopies, 150)
	ids := map[string]bool{}
	for _, m := range msgs {
		require.False(t, ids[m.MessageId], "message ids are all different")
		ids[m.MessageId] = true
	}
}

func TestPaymentFingerprint(t *testing.T) {
	t.Parallel()
	p := Payment{OrderID: "o-1", AmountCents: 500, Currency: "EUR"}
	require.Equal(t, p.Fingerprint(), Payment{OrderID: "o-1", AmountCents: 500, Currency: "eur"}.Fingerprint())
	require.NotEqual(t, p.Fingerprint(), Payment{OrderID: "o-1", AmountCents: 501, Currency: "EUR"}.Fingerprint())
	require.NotEqual(t, p.Fingerprint(), Payment{OrderID: "o-1", AmountCents: 500, Currency: "USD"}.Fingerprint())
	require.NotEqual(t, p.Fingerprint(), Payment{OrderID: "o-2", AmountCents: 500, Currency: "EUR"}.Fingerprint())
}
