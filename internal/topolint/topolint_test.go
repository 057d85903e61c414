package topolint_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/topolint"
)

// The work queue of a quorum route as the worker declares it.
var workArgs = map[string]any{
	"x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "payments.dead",
	"x-delivery-limit": float64(20), "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
}

func clone(m map[string]any, kv ...any) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] == nil {
			delete(out, kv[i].(string))
			continue
		}
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

func rules(fs []topolint.Finding) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Severity+" "+f.Rule)
	}
	return out
}

// Each rule fires on the setting it is about, and a queue as the worker
// declares it has no finding.
func TestCheck_Rules(t *testing.T) {
	t.Parallel()
	work := topolint.Queue{Name: "payments", Role: "work", Args: workArgs, Consumed: true}
	rt := topolint.Route{Attempts: 8, LongestRun: time.Minute}
	cases := []struct {
		name         string
		q            topolint.Queue
		args, policy map[string]any
		want         []string
	}{
		{"as declared", work, workArgs, nil, nil},
		{"declared elsewhere without a dead-letter target", work,
			map[string]any{"x-queue-type": "quorum", "x-delivery-limit": float64(20)}, nil,
			[]string{"error no-dead-letter-target"}},
		{"delivery limit at the attempts", work, clone(workArgs, "x-delivery-limit", float64(8)), nil,
			[]string{"warning policy-override", "error delivery-limit"}},
		{"an operator policy lowers the delivery limit", work, workArgs, map[string]any{"delivery-limit": float64(3)},
			[]string{"warning policy-override", "error delivery-limit"}},
		{"at most once", work, clone(workArgs, "x-dead-letter-strategy", nil), nil,
			[]string{"error at-most-once"}},
		{"a policy sets at most once where the worker declares nothing", topolint.Queue{Name: "q", Role: "work", Args: map[string]any{"x-dead-letter-exchange": ""}, Consumed: true},
			map[string]any{"x-queue-type": "quorum", "x-dead-letter-exchange": ""}, map[string]any{"dead-letter-strategy": "at-most-once"},
			[]string{"warning policy-override", "error at-most-once"}},
		{"at least once without reject-publish", work, clone(workArgs, "x-overflow", "drop-head"), nil,
			[]string{"warning policy-override", "error overflow"}},
		{"a TTL by policy without a dead-letter target", topolint.Queue{Name: "q", Role: "work", Args: map[string]any{}, Consumed: true},
			map[string]any{"x-queue-type": "classic"}, map[string]any{"message-ttl": float64(60000)},
			[]string{"error no-dead-letter-target", "error ttl-without-dead-letter"}},
		{"the queue expires", work, workArgs, map[string]any{"expires": float64(3600000)}, []string{"error expires"}},
		{"a length limit drops from the dead-letter queue", topolint.Queue{Name: "payments.dlq", Role: "dlq", Args: map[string]any{"x-queue-type": "quorum"}},
			map[string]any{"x-queue-type": "quorum"}, map[string]any{"max-length": float64(1000)},
			[]string{"error length-limit"}},
		{"a consumer timeout shorter than the handler timeout", work, workArgs, map[string]any{"consumer-timeout": float64(30000)},
			[]string{"error consumer-timeout"}},
		{"a consumer timeout longer than the handler timeout", work, workArgs, map[string]any{"consumer-timeout": float64(600000)}, nil},
		{"a policy that repeats the worker's arguments", work, workArgs, map[string]any{"dead-letter-exchange": "", "delivery-limit": float64(20)}, nil},
		{"a policy's dead-letter exchange loses to the argument", work, workArgs, map[string]any{"dead-letter-exchange": "elsewhere"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got := topolint.Check(rt, c.q, c.args, c.policy, "policy p")
			require.ElementsMatch(t, c.want, rules(got), "%+v", got)
			for _, f := range got {
				require.Equal(t, c.q.Name, f.Queue)
				require.NotEmpty(t, f.Message)
			}
		})
	}
}

// Lint reads each queue through the API (the vhost escaped), reports a
// queue not declared, lists errors first, and fails on an API that
// refuses it.
func TestLint_ReadsTheAPI(t *testing.T) {
	t.Parallel()
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.EscapedPath())
		user, pass, _ := r.BasicAuth()
		if user != "ops" || pass != "secret" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		switch r.URL.EscapedPath() {
		case "/api/queues/%2F/payments":
			_ = json.NewEncoder(w).Encode(map[string]any{"type": "quorum", "arguments": workArgs,
				"policy": "ttl", "effective_policy_definition": map[string]any{"message-ttl": 1000}})
		case "/api/queues/%2F/payments.dlq":
			_ = json.NewEncoder(w).Encode(map[string]any{"type": "quorum", "arguments": map[string]any{"x-queue-type": "quorum"}})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	routes := []topolint.Route{{Attempts: 8, Queues: []topolint.Queue{
		{Name: "payments.dlq", Role: "dlq", Args: map[string]any{"x-queue-type": "quorum"}},
		{Name: "payments.dead", Role: "dead", Args: map[string]any{}},
		{Name: "payments", Role: "work", Args: workArgs, Consumed: true},
	}}}
	api, err := topolint.NewAPI(strings.Replace(srv.URL, "http://", "http://ops:secret@", 1), "", "")
	require.NoError(t, err)
	found, err := topolint.Lint(t.Context(), api, "/", routes)
	require.NoError(t, err)
	require.Equal(t, []string{"warning missing"}, rules(found), "a TTL with a dead-letter target is fine: %+v", found)
	require.Equal(t, []string{"/api/queues/%2F/payments.dlq", "/api/queues/%2F/payments.dead", "/api/queues/%2F/payments"}, paths)

	bad, err := topolint.NewAPI(srv.URL, "guest", "wrong")
	require.NoError(t, err)
	_, err = topolint.Lint(t.Context(), bad, "/", routes)
	require.ErrorContains(t, err, "401")
}

func TestManagementURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string][2]string{
		"amqp://guest:guest@127.0.0.1:5672/": {"http://guest:guest@127.0.0.1:15672", "/"},
		"amqp://u:p@rabbit:5672/prod":        {"http://u:p@rabbit:15672", "prod"},
		"amqps://u:p@rabbit/%2Fshop":         {"https://u:p@rabbit:15671", "/shop"},
		"amqp://rabbit":                      {"http://guest:guest@rabbit:15672", "/"},
	} {
		mgmt, vhost, err := topolint.ManagementURL(in)
		require.NoError(t, err, in)
		require.Equal(t, want, [2]string{mgmt, vhost}, in)
	}
}
