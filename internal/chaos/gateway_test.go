package chaos_test

import (
	"bytes"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/chaos"
)

func charge(t *testing.T, g *chaos.Gateway, key, body string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, g.URL()+"/charges", bytes.NewBufferString(body))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode
}

func TestGatewayIsIdempotentAndRecords(t *testing.T) {
	t.Parallel()
	g := chaos.NewGateway(1)
	t.Cleanup(g.Close)
	a := `{"order_id":"a","amount_cents":100,"currency":"EUR"}`

	require.Equal(t, http.StatusCreated, charge(t, g, "payment:a", a))
	require.Equal(t, http.StatusOK, charge(t, g, "payment:a", a), "a replay answers the stored result")
	require.Equal(t, http.StatusUnprocessableEntity, charge(t, g, "payment:a", `{"order_id":"a","amount_cents":999,"currency":"EUR"}`))
	require.Equal(t, http.StatusPaymentRequired, charge(t, g, "payment:x-declined", `{"order_id":"x-declined","amount_cents":1,"currency":"EUR"}`))
	require.Equal(t, http.StatusBadRequest, charge(t, g, "", a))

	calls := g.Calls()
	require.Len(t, calls, 5)
	require.True(t, calls[0].Created)
	for _, c := range calls[1:] {
		require.False(t, c.Created)
	}
	require.Equal(t, "a", calls[0].OrderID)
	require.Equal(t, int64(100), calls[0].AmountCents)
}

func TestGatewayPhases(t *testing.T) {
	t.Parallel()
	g := chaos.NewGateway(7)
	t.Cleanup(g.Close)

	g.SetPhase(chaos.GatewayPhase{FailRate: 1}, 0)
	require.Equal(t, http.StatusServiceUnavailable, charge(t, g, "payment:b", `{"order_id":"b","amount_cents":5,"currency":"EUR"}`))

	g.SetPhase(chaos.GatewayPhase{LostReplyRate: 1}, 0)
	require.Equal(t, http.StatusInternalServerError, charge(t, g, "payment:b", `{"order_id":"b","amount_cents":5,"currency":"EUR"}`))
	g.SetPhase(chaos.GatewayPhase{}, 0)
	require.Equal(t, http.StatusOK, charge(t, g, "payment:b", `{"order_id":"b","amount_cents":5,"currency":"EUR"}`),
		"the lost reply had charged: the retry is a replay")

	g.SetPhase(chaos.GatewayPhase{FailRate: 1}, time.Nanosecond)
	require.Equal(t, http.StatusCreated, charge(t, g, "payment:c", `{"order_id":"c","amount_cents":5,"currency":"EUR"}`),
		"a phase ends after its duration")

	created := 0
	for _, c := range g.Calls() {
		if c.Created {
			created++
		}
	}
	require.Equal(t, 2, created)
}
