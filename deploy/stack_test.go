// Package deploy_test checks the compose stack and the configuration files
// under deploy/ without a Docker engine: the compose model as Docker
// Compose loads it (compose-go), and the wiring between the services'
// configuration files (which service each one sends to, on which port).
// promtool and amtool check the Prometheus and Alertmanager files
// themselves (scripts/test-alerts.sh).
package deploy_test

import (
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// root is the repository root, where docker-compose.yml lives.
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("..")
	require.NoError(t, err)
	return dir
}

// loadStack loads docker-compose.yml as `docker compose` does (default
// profile, no .env needed: every variable it uses has a default).
func loadStack(t *testing.T) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{filepath.Join(root(t), "docker-compose.yml")},
		cli.WithWorkingDirectory(root(t)), cli.WithName("inboxmq"), cli.WithResolvedPaths(true))
	require.NoError(t, err)
	p, err := opts.LoadProject(t.Context())
	require.NoError(t, err, "docker-compose.yml loads")
	return p
}

// readYAML decodes a file of the repository into v.
func readYAML(t *testing.T, rel string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root(t), rel))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, v), rel)
}

// hostPort splits an endpoint ("http://host:port/path" or "host:port").
func hostPort(t *testing.T, endpoint string) (string, string) {
	t.Helper()
	if strings.Contains(endpoint, "://") {
		u, err := url.Parse(endpoint)
		require.NoError(t, err)
		endpoint = u.Host
	}
	host, port, err := net.SplitHostPort(endpoint)
	require.NoError(t, err, endpoint)
	return host, port
}

func TestStack_ServicesRestartAndMountWhatExists(t *testing.T) {
	t.Parallel()
	p := loadStack(t)
	want := []string{
		"rabbitmq", "postgres", "redis", "payment-worker", "prometheus", "grafana",
		"alertmanager", "alert-logger", "otel-collector", "jaeger",
	}
	for _, name := range want {
		require.Contains(t, p.Services, name)
	}
	for name, svc := range p.Services {
		require.Contains(t, []string{"always", "unless-stopped", "on-failure"}, svc.Restart, "%s has a restart policy", name)
		for dep := range svc.DependsOn {
			require.Contains(t, p.Services, dep, "%s depends on a service of the stack", name)
		}
		for _, v := range svc.Volumes {
			if v.Type != types.VolumeTypeBind {
				continue
			}
			_, err := os.Stat(v.Source)
			require.NoError(t, err, "%s mounts %s, which exists", name, v.Source)
		}
		for _, port := range svc.Ports {
			require.Equal(t, "127.0.0.1", port.HostIP, "%s publishes on loopback only", name)
		}
	}
	_, err := os.Stat(filepath.Join(root(t), ".dockerignore"))
	require.NoError(t, err, "the payment-worker's build context has a .dockerignore")
}

// The path of a trace: worker → collector (OTLP/HTTP) → Jaeger
// (OTLP/gRPC) → Grafana's Jaeger data source, which the Prometheus data
// source's exemplars open; and of an alert: Prometheus → Alertmanager →
// the webhook. Each hop names a service of the stack on a port it
// listens on.
func TestStack_TracesAndAlertsAreWired(t *testing.T) {
	t.Parallel()
	p := loadStack(t)

	// The worker exports to the collector's OTLP/HTTP receiver.
	worker := p.Services["payment-worker"]
	endpoint := worker.Environment["OTEL_EXPORTER_OTLP_ENDPOINT"]
	require.NotNil(t, endpoint)
	host, port := hostPort(t, *endpoint)
	require.Equal(t, "otel-collector", host)
	require.Contains(t, worker.DependsOn, "otel-collector")

	var col struct {
		Receivers map[string]struct {
			Protocols map[string]struct {
				Endpoint string `yaml:"endpoint"`
			} `yaml:"protocols"`
		} `yaml:"receivers"`
		Processors map[string]any `yaml:"processors"`
		Exporters  map[string]struct {
			Endpoint string `yaml:"endpoint"`
		} `yaml:"exporters"`
		Service struct {
			Pipelines map[string]struct {
				Receivers  []string `yaml:"receivers"`
				Processors []string `yaml:"processors"`
				Exporters  []string `yaml:"exporters"`
			} `yaml:"pipelines"`
		} `yaml:"service"`
	}
	readYAML(t, "deploy/otel-collector/config.yaml", &col)
	_, httpPort := hostPort(t, col.Receivers["otlp"].Protocols["http"].Endpoint)
	require.Equal(t, port, httpPort, "the worker's endpoint is the collector's OTLP/HTTP port")
	traces, ok := col.Service.Pipelines["traces"]
	require.True(t, ok, "the collector has a traces pipeline")
	require.Contains(t, traces.Receivers, "otlp")
	for _, r := range traces.Receivers {
		require.Contains(t, col.Receivers, r)
	}
	for _, pr := range traces.Processors {
		require.Contains(t, col.Processors, pr)
	}
	toJaeger := false
	for _, e := range traces.Exporters {
		require.Contains(t, col.Exporters, e)
		if ep := col.Exporters[e].Endpoint; ep != "" {
			h, port := hostPort(t, ep)
			require.Contains(t, p.Services, h, "exporter %s sends to a service of the stack", e)
			if h == "jaeger" && port == "4317" {
				toJaeger = true
			}
		}
	}
	require.True(t, toJaeger, "the traces pipeline exports to Jaeger's OTLP/gRPC port")
	require.Equal(t, "true", *p.Services["jaeger"].Environment["COLLECTOR_OTLP_ENABLED"])

	// Grafana: exemplars' trace_id opens the Jaeger data source.
	var ds struct {
		Datasources []struct {
			UID      string `yaml:"uid"`
			Type     string `yaml:"type"`
			URL      string `yaml:"url"`
			JSONData struct {
				Exemplars []struct {
					Name          string `yaml:"name"`
					DatasourceUID string `yaml:"datasourceUid"`
				} `yaml:"exemplarTraceIdDestinations"`
			} `yaml:"jsonData"`
		} `yaml:"datasources"`
	}
	readYAML(t, "deploy/grafana/provisioning/datasources/prometheus.yml", &ds)
	uids := map[string]string{} // uid -> type
	for _, d := range ds.Datasources {
		uids[d.UID] = d.Type
		h, _ := hostPort(t, d.URL)
		require.Contains(t, p.Services, h, "data source %s reads a service of the stack", d.UID)
	}
	linked := false
	for _, d := range ds.Datasources {
		for _, e := range d.JSONData.Exemplars {
			require.Equal(t, "trace_id", e.Name, "the exemplar label the worker's metrics write")
			require.Equal(t, "jaeger", uids[e.DatasourceUID], "exemplars open a trace data source")
			linked = true
		}
	}
	require.True(t, linked, "Prometheus exemplars link to traces")
	require.Contains(t, p.Services["prometheus"].Command, "--enable-feature=exemplar-storage")

	// Prometheus sends alerts to Alertmanager, which posts to the webhook.
	var prom struct {
		Alerting struct {
			Alertmanagers []struct {
				StaticConfigs []struct {
					Targets []string `yaml:"targets"`
				} `yaml:"static_configs"`
			} `yaml:"alertmanagers"`
		} `yaml:"alerting"`
	}
	readYAML(t, "deploy/prometheus/prometheus.yml", &prom)
	require.NotEmpty(t, prom.Alerting.Alertmanagers)
	for _, am := range prom.Alerting.Alertmanagers {
		for _, sc := range am.StaticConfigs {
			for _, target := range sc.Targets {
				h, port := hostPort(t, target)
				require.Equal(t, "alertmanager", h)
				require.True(t, slices.Contains(p.Services["alertmanager"].Command, "--web.listen-address=0.0.0.0:"+port))
			}
		}
	}
	var am struct {
		Route struct {
			Receiver string `yaml:"receiver"`
		} `yaml:"route"`
		Receivers []struct {
			Name     string `yaml:"name"`
			Webhooks []struct {
				URL string `yaml:"url"`
			} `yaml:"webhook_configs"`
		} `yaml:"receivers"`
	}
	readYAML(t, "deploy/alertmanager/alertmanager.yml", &am)
	found := false
	for _, r := range am.Receivers {
		if r.Name != am.Route.Receiver {
			continue
		}
		found = true
		require.NotEmpty(t, r.Webhooks)
		for _, w := range r.Webhooks {
			h, port := hostPort(t, w.URL)
			require.Equal(t, "alert-logger", h)
			require.Equal(t, port, *p.Services["alert-logger"].Environment["HTTP_PORT"])
		}
	}
	require.True(t, found, "the route's receiver is defined")
}
