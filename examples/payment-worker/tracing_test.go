package main

import (
	"bytes"
	"encoding/hex"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/testenv"
)

// otlpSink is a fake OTLP/HTTP collector: it keeps every body posted to
// /v1/traces (protobuf; the test looks for names and ids in the bytes).
type otlpSink struct {
	mu   sync.Mutex
	body []byte
}

func (s *otlpSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	if r.URL.Path == "/v1/traces" {
		s.mu.Lock()
		s.body = append(s.body, b...)
		s.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
}

func (s *otlpSink) contains(b []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Contains(s.body, b)
}

// With OTEL_EXPORTER_OTLP_ENDPOINT set, the worker exports its spans: the
// delivery's, its SQL statements (otelpgx) and the gateway call
// (otelhttp), which carries the W3C traceparent to the gateway; the spans
// still buffered at SIGTERM are flushed before the process exits.
func TestWorkerExportsTracesWhenConfigured(t *testing.T) {
	t.Parallel()
	sink := &otlpSink{}
	collector := newLoopbackServer(t, sink)
	var (
		mu           sync.Mutex
		traceparents []string
	)
	gatewayURL := newLoopbackServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		traceparents = append(traceparents, r.Header.Get("traceparent"))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	b := setup(t, "GATEWAY_URL="+gatewayURL,
		"OTEL_EXPORTER_OTLP_ENDPOINT="+collector, "OTEL_SERVICE_NAME=payments-under-test",
		"OTEL_TRACES_SAMPLER=always_on", "OTEL_BSP_SCHEDULE_DELAY=600000") // only the exit's flush sends
	b.migrate(t)
	w := b.start(t)
	b.publishOrders(t, "traced", 1, 1)
	testenv.WaitFor(t, "the payment is recorded", func() bool {
		return b.count(t, `SELECT count(*) FROM payments WHERE order_id = 'traced-000'`) == 1
	})
	w.stop(t)

	mu.Lock()
	require.Len(t, traceparents, 1)
	parts := strings.Split(traceparents[0], "-")
	mu.Unlock()
	require.Len(t, parts, 4, "the gateway call carries a W3C traceparent")
	traceID, err := hex.DecodeString(parts[1])
	require.NoError(t, err)
	require.True(t, sink.contains(traceID), "the gateway call's trace was exported")
	for _, want := range []string{"payments-under-test", "process " + b.queue, "INSERT INTO payments", "POST"} {
		require.True(t, sink.contains([]byte(want)), "the export holds %q", want)
	}
}

// The worker traces over OTLP/HTTP only: it links no gRPC exporter and no
// other exporter. (otlptracehttp's own configuration package imports parts
// of google.golang.org/grpc; docs/performance.md gives the binary's size.)
func TestWorkerLinksOnlyTheHTTPExporter(t *testing.T) {
	t.Parallel()
	out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", "github.com/inboxmq/inboxmq/examples/payment-worker").Output()
	require.NoError(t, err, "go list")
	var extra []string
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "go.opentelemetry.io/otel/exporters/") &&
			!strings.HasPrefix(pkg, "go.opentelemetry.io/otel/exporters/otlp/otlptrace") ||
			strings.HasPrefix(pkg, "go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc") {
			extra = append(extra, pkg)
		}
	}
	require.Empty(t, extra)
}
