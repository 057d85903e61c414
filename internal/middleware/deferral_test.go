package middleware_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/middleware"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// deferralDelivery is a delivery of key with the tenant header tenant.
func deferralDelivery(key, tenant string) *inboxtype.Delivery {
	d := inboxtype.NewDelivery("q", "ns", "w1", &amqp.Delivery{MessageId: key, Headers: amqp.Table{"tenant": tenant}})
	d.Key = key
	return d
}

// A run that asks for a delay (a 429 with Retry-After) defers its key:
// the key's next deliveries are deferred without running, uncounted, until
// the delay ends; other keys run meanwhile.
func TestDeferral_DefersTheKeyNotTheOthers(t *testing.T) {
	t.Parallel()
	var ran []string
	tooMany := map[string]bool{"k1": true}
	h := middleware.Deferral(nil)(func(_ context.Context, d *inboxtype.Delivery) error {
		ran = append(ran, d.Key)
		if tooMany[d.Key] {
			tooMany[d.Key] = false
			return retry.After(200*time.Millisecond, errors.New("HTTP 429"))
		}
		return nil
	})
	ctx := t.Context()

	require.Error(t, h(ctx, deferralDelivery("k1", "")))
	err := h(ctx, deferralDelivery("k1", ""))
	dec := retry.Classify(err)
	require.Equal(t, retry.KindRetry, dec.Kind)
	require.True(t, dec.Uncounted, "a deferred delivery spends no attempt")
	require.Equal(t, middleware.ReasonKeyDeferred, dec.Reason)
	require.Positive(t, dec.Delay)
	require.LessOrEqual(t, dec.Delay, 200*time.Millisecond, "until the asked delay ends, no later")
	require.NoError(t, h(ctx, deferralDelivery("k2", "")), "another key runs")
	require.Equal(t, []string{"k1", "k2"}, ran, "the deferred delivery did not run")

	testenv.WaitFor(t, "the deferral to end", func() bool {
		return h(ctx, deferralDelivery("k1", "")) == nil
	})
	require.Equal(t, []string{"k1", "k2", "k1"}, ran)
}

// With a tenant function, the deferral is the tenant's: its other keys
// wait too; other tenants' keys run.
func TestDeferral_DefersTheTenant(t *testing.T) {
	t.Parallel()
	var ran []string
	tenant := func(d *inboxtype.Delivery) string { s, _ := d.Raw.Headers["tenant"].(string); return s }
	h := middleware.Deferral(tenant)(func(_ context.Context, d *inboxtype.Delivery) error {
		ran = append(ran, d.Key)
		if d.Key == "a1" {
			return retry.After(time.Hour, errors.New("HTTP 429"))
		}
		return nil
	})
	ctx := t.Context()
	require.Error(t, h(ctx, deferralDelivery("a1", "acme")))
	err := h(ctx, deferralDelivery("a2", "acme"))
	require.Equal(t, middleware.ReasonKeyDeferred, retry.Classify(err).Reason)
	require.ErrorContains(t, err, "tenant acme deferred")
	require.NoError(t, h(ctx, deferralDelivery("b1", "globex")))
	require.NoError(t, h(ctx, deferralDelivery("n1", "")), "a delivery without a tenant is deferred by its key alone")

	// Neither a policy's retry (no delay asked) nor a deferral of its own
	// (another worker holds the key) defers the key.
	h = middleware.Deferral(nil)(func(_ context.Context, d *inboxtype.Delivery) error {
		ran = append(ran, d.Key)
		if d.Key == "r" {
			return retry.Retryable(errors.New("blip"))
		}
		return retry.Defer(time.Hour, errors.New("locked"))
	})
	for range 2 {
		require.Error(t, h(ctx, deferralDelivery("r", "")))
		require.Error(t, h(ctx, deferralDelivery("l", "")))
	}
	require.Equal(t, []string{"a1", "b1", "n1", "r", "l", "r", "l"}, ran)
}
