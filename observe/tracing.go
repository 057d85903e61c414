package observe

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// ErrTracingNotConfigured is returned by [NewTracerProvider] when the
// environment configures no trace exporter (see [TracingConfigured]).
var ErrTracingNotConfigured = errors.New("observe: the environment configures no trace exporter")

// TracingConfigured reports whether the standard OpenTelemetry environment
// asks for traces to be exported: OTEL_EXPORTER_OTLP_ENDPOINT,
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_TRACES_EXPORTER is set (and
// OTEL_TRACES_EXPORTER is not "none"), and OTEL_SDK_DISABLED is not "true".
// With none of them set a worker builds no SDK: no exporter, no goroutine,
// and spans that do not record.
func TracingConfigured() bool {
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	switch exp := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")); {
	case exp == "none":
		return false
	case exp != "":
		return true
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// NewTracerProvider builds an OpenTelemetry SDK TracerProvider from the
// standard environment when [TracingConfigured] says it asks for one, and
// returns [ErrTracingNotConfigured] otherwise. The caller owns the
// provider: Shutdown flushes the spans still buffered (a Worker that built
// it does so in Stop).
//
// The environment decides everything, as the OpenTelemetry specification
// describes it:
//   - the exporter: OTEL_TRACES_EXPORTER (otlp, the default; console; none),
//     OTEL_EXPORTER_OTLP_PROTOCOL or OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
//     (http/protobuf, the default, or grpc), OTEL_EXPORTER_OTLP_ENDPOINT or
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, and their _HEADERS, _TIMEOUT,
//     _COMPRESSION and _INSECURE variants;
//   - the resource: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, with
//     serviceName as service.name when neither names one (empty: the
//     SDK's unknown_service:<executable>);
//   - sampling: OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (the SDK's
//     default: parentbased_always_on; an invalid value is reported
//     through otel.Handle and the default is kept);
//   - batching: OTEL_BSP_SCHEDULE_DELAY, OTEL_BSP_MAX_QUEUE_SIZE,
//     OTEL_BSP_MAX_EXPORT_BATCH_SIZE, OTEL_BSP_EXPORT_TIMEOUT.
//
// An exporter setting it cannot use (an unknown exporter or protocol) is
// an error. It does no network I/O: the exporter connects when it first
// exports.
func NewTracerProvider(ctx context.Context, serviceName string) (*sdktrace.TracerProvider, error) {
	if !TracingConfigured() {
		return nil, ErrTracingNotConfigured
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, fmt.Errorf("observe: trace exporter: %w", err)
	}
	detectors := []resource.Option{resource.WithTelemetrySDK()}
	if serviceName != "" {
		detectors = append(detectors, resource.WithAttributes(attribute.String("service.name", serviceName)))
	}
	// Last, so that OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win.
	detectors = append(detectors, resource.WithFromEnv())
	res, err := resource.New(ctx, detectors...)
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("observe: trace resource: %w", err)
	}
	if serviceName == "" {
		// The SDK's default names the executable.
		if res, err = resource.Merge(resource.Default(), res); err != nil {
			_ = exp.Shutdown(ctx)
			return nil, fmt.Errorf("observe: trace resource: %w", err)
		}
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}
