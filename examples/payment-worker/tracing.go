package main

import (
	"context"
	"net/http"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/inboxmq/inboxmq/observe"
)

// tracing is the worker's OpenTelemetry set-up: an SDK built from the
// standard OTEL_* environment when it asks for traces, a no-op otherwise.
type tracing struct {
	tp       trace.TracerProvider
	shutdown func(context.Context) error
	on       bool
}

// setupTracing builds the SDK from the environment (observe.NewTracerProvider:
// OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER, …;
// service.name defaults to payment-worker) and installs it as the global
// provider, for libraries that use it. With no OTEL_* exporter setting it
// builds nothing: the provider is the no-op one, and the delivery path
// pays nothing for tracing.
func setupTracing(ctx context.Context) (*tracing, error) {
	if !observe.TracingConfigured() {
		return &tracing{tp: noop.NewTracerProvider(), shutdown: func(context.Context) error { return nil }}, nil
	}
	tp, err := observe.NewTracerProvider(ctx, "payment-worker")
	if err != nil {
		return nil, err
	}
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return &tracing{tp: tp, shutdown: tp.Shutdown, on: true}, nil
}

// flush exports the spans still buffered, bounded by a few seconds.
func (t *tracing) flush() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return t.shutdown(ctx)
}

// tracePool makes each statement on the pool a client span under the
// delivery's span (otelpgx); the SQL text is an attribute, its arguments
// are not.
func (t *tracing) tracePool(cfg *pgxpool.Config) {
	if t.on {
		cfg.ConnConfig.Tracer = otelpgx.NewTracer(otelpgx.WithTracerProvider(t.tp), otelpgx.WithDisableAcquireTracer())
	}
}

// httpClient is the gateway's client: with tracing on, each call is a
// client span and carries the W3C traceparent to the gateway.
func (t *tracing) httpClient() *http.Client {
	if !t.on {
		return nil // Gateway's default client
	}
	return &http.Client{Transport: otelhttp.NewTransport(http.DefaultTransport,
		otelhttp.WithTracerProvider(t.tp), otelhttp.WithPropagators(propagation.TraceContext{}))}
}
