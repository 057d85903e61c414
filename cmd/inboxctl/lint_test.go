package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/topolint"
)

// lint reads the management API (a stand-in here: the work queue as the
// worker declares it, under a policy given by the test; the route's other
// queues not declared yet), prints what it finds and exits 1 only on an
// error, so that CI fails on what loses messages.
func TestLint(t *testing.T) {
	t.Parallel()
	policy := map[string]any{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.EscapedPath() != "/api/queues/prod/payments" {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{
			"type": "quorum",
			"arguments": map[string]any{"x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "payments.dead",
				"x-delivery-limit": 20, "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"},
			"effective_policy_definition": policy,
		})
	}))
	t.Cleanup(srv.Close)
	b := &cliBundle{env: map[string]string{"AMQP_URL": "amqp://guest:guest@127.0.0.1:5672/prod"}}

	r := b.run(t, "lint", "payments", "--management-url", srv.URL)
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, "missing")

	policy["delivery-limit"] = 5
	r = b.run(t, "lint", "payments", "--management-url", srv.URL, "-o", "json")
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.errOut, "1 error(s)")
	var found []topolint.Finding
	r.json(t, &found)
	require.Equal(t, topolint.Error, found[0].Severity, "errors first")
	require.Equal(t, "delivery-limit", found[0].Rule)
	require.Equal(t, "payments", found[0].Queue)

	r = b.run(t, "lint", "payments", "--management-url", srv.URL, "--attempts", "4")
	require.Equal(t, exitOK, r.code, "a limit above the attempts: %s", r.out)

	r = b.run(t, "lint", "payments", "--management-url", "http://127.0.0.1:1")
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.errOut, "rabbitmq_management")
}
