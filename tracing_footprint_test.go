package inboxmq_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A worker that does not trace links no tracing SDK, no exporter and no
// gRPC: the worker builds no SDK itself; a program that traces builds
// one and gives it in Config.TracerProvider.
func TestWorker_LinksNoTracingSDK(t *testing.T) {
	t.Parallel()
	out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", "github.com/inboxmq/inboxmq").Output()
	require.NoError(t, err)
	for _, pkg := range strings.Fields(string(out)) {
		require.False(t, strings.HasPrefix(pkg, "go.opentelemetry.io/otel/sdk") ||
			strings.HasPrefix(pkg, "go.opentelemetry.io/otel/exporters/") ||
			strings.HasPrefix(pkg, "google.golang.org/grpc"), "the root package links %s", pkg)
	}
}
