package observe_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/inboxmq/inboxmq/observe"
)

// otelVars are every variable TracingConfigured reads, cleared for a test.
var otelVars = []string{
	"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
	"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
}

func clearOTel(t *testing.T) {
	t.Helper()
	for _, v := range otelVars {
		t.Setenv(v, "")
	}
}

//nolint:paralleltest // t.Setenv
func TestTracingConfigured(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want bool
	}{
		{"nothing set", nil, false},
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, true},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, true},
		{"exporter", map[string]string{"OTEL_TRACES_EXPORTER": "console"}, true},
		{"exporter none", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
		{"sdk disabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
		{"service name alone", map[string]string{"OTEL_SERVICE_NAME": "payments"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearOTel(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			require.Equal(t, tc.want, observe.TracingConfigured())
			if !tc.want {
				_, err := observe.NewTracerProvider(t.Context(), "x")
				require.ErrorIs(t, err, observe.ErrTracingNotConfigured)
			}
		})
	}
}

//nolint:paralleltest // t.Setenv
func TestNewTracerProvider_ExportsOverOTLPHTTP(t *testing.T) {
	var (
		mu    sync.Mutex
		paths []string
		body  []byte
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		paths = append(paths, r.URL.Path)
		body = append(body, b...)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(srv.Close)
	clearOTel(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")

	tp, err := observe.NewTracerProvider(t.Context(), "payment-worker")
	require.NoError(t, err)
	_, span := tp.Tracer("test").Start(context.Background(), "process payments")
	span.End()
	require.NoError(t, tp.Shutdown(t.Context()), "Shutdown flushes the batch")

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"/v1/traces"}, paths)
	require.True(t, bytes.Contains(body, []byte("process payments")), "the span was exported")
	require.True(t, bytes.Contains(body, []byte("payment-worker")), "service.name defaults to the given name")
	require.True(t, bytes.Contains(body, []byte("deployment.environment")), "OTEL_RESOURCE_ATTRIBUTES applies")
}

//nolint:paralleltest // t.Setenv
func TestNewTracerProvider_ServiceNameFromEnvWins(t *testing.T) {
	clearOTel(t)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:1/v1/traces") // never reached
	t.Setenv("OTEL_SERVICE_NAME", "from-env")
	tp, err := observe.NewTracerProvider(t.Context(), "default-name")
	require.NoError(t, err)
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	_, span := tp.Tracer("test").Start(context.Background(), "s")
	defer span.End()
	ro, ok := span.(sdktrace.ReadOnlySpan)
	require.True(t, ok)
	name, _ := ro.Resource().Set().Value("service.name")
	require.Equal(t, "from-env", name.AsString())
}

//nolint:paralleltest // t.Setenv
func TestNewTracerProvider_BadExporterIsAnError(t *testing.T) {
	clearOTel(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "carrier-pigeon")
	_, err := observe.NewTracerProvider(t.Context(), "x")
	require.ErrorContains(t, err, "observe: trace exporter")
}
