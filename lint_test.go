package inboxmq_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/internal/logtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// At start-up the worker lints its routes' queues through the management
// API (here a stand-in that reports a consumer-timeout policy on the work
// queue, shorter than the handler timeout) and logs each finding with its
// queue and rule, at error for what loses or loops messages. The start
// does not fail.
func TestWorker_StartupLintLogsWhatLosesMessages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	var asked []string
	mgmt := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.URL.EscapedPath())
		mu.Unlock()
		if r.URL.EscapedPath() != "/api/queues/%2F/"+b.queue {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{
			"type": "quorum",
			"arguments": map[string]any{"x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": b.queue + ".dead",
				"x-delivery-limit": 20, "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"},
			"policy": "short", "effective_policy_definition": map[string]any{"consumer-timeout": 5000},
		})
	}))
	t.Cleanup(mgmt.Close)

	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, noop[order], nil)
	logger, logs := logtest.New(slog.LevelInfo)
	startHealthWorker(t, &inboxmq.Config{
		URL: testenv.AMQPURL(), DB: b.pool, Routes: routes, Logger: logger, ManagementURL: mgmt.URL,
	})
	lines := logs.Containing("topology lint: a consumer timeout of 5s")
	require.Len(t, lines, 1, "the lint ran before Start returned")
	require.Equal(t, slog.LevelError, lines[0].Level)
	require.Equal(t, b.queue, lines[0].Attrs["queue"])
	require.Equal(t, "consumer-timeout", lines[0].Attrs["rule"])
	mu.Lock()
	defer mu.Unlock()
	require.Contains(t, asked, "/api/queues/%2F/"+b.queue)
	require.Contains(t, strings.Join(asked, " "), "/api/queues/%2F/"+b.queue+".dlq")
}
