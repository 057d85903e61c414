package main

import (
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// The Kubernetes manifest in deploy/ parses, and stays in step with the
// worker: the probes hit the endpoints the health listener serves on the
// port it listens on, the grace period outlasts the worker's stop, and every
// variable it sets is one the worker reads.
func TestKubernetesManifest(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../deploy/kubernetes/payment-worker.yaml")
	require.NoError(t, err)
	type probe struct {
		HTTPGet struct {
			Path string `yaml:"path"`
			Port string `yaml:"port"`
		} `yaml:"httpGet"`
		PeriodSeconds    int `yaml:"periodSeconds"`
		FailureThreshold int `yaml:"failureThreshold"`
	}
	var d struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Spec       struct {
			Template struct {
				Spec struct {
					TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
					Containers                    []struct {
						Env []struct {
							Name  string `yaml:"name"`
							Value string `yaml:"value"`
						} `yaml:"env"`
						Ports []struct {
							Name          string `yaml:"name"`
							ContainerPort int    `yaml:"containerPort"`
						} `yaml:"ports"`
						Liveness  *probe `yaml:"livenessProbe"`
						Readiness *probe `yaml:"readinessProbe"`
						Startup   *probe `yaml:"startupProbe"`
						Resources struct {
							Requests map[string]string `yaml:"requests"`
							Limits   map[string]string `yaml:"limits"`
						} `yaml:"resources"`
					} `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &d), "the manifest parses")
	require.Equal(t, "apps/v1", d.APIVersion)
	require.Equal(t, "Deployment", d.Kind)
	spec := d.Spec.Template.Spec
	require.Len(t, spec.Containers, 1)
	c := spec.Containers[0]

	require.Greater(t, time.Duration(spec.TerminationGracePeriodSeconds)*time.Second, 25*time.Second,
		"SIGKILL comes after the worker's graceful stop (Config.StopTimeout, 25s by default)")

	// Every variable is read by the worker, and METRICS_ADDR listens on
	// the port the probes use, on every interface.
	params, err := env.GetFieldParams(&config{})
	require.NoError(t, err)
	read := map[string]bool{}
	for _, p := range params {
		read[p.Key] = true
	}
	env := map[string]string{}
	for _, e := range c.Env {
		require.True(t, read[e.Name], "the worker reads %s", e.Name)
		env[e.Name] = e.Value
	}
	host, port, err := net.SplitHostPort(env["METRICS_ADDR"])
	require.NoError(t, err)
	require.Empty(t, host, "the kubelet probes the pod's IP, not loopback")
	require.Len(t, c.Ports, 1)
	require.Equal(t, port, strconv.Itoa(c.Ports[0].ContainerPort))

	for name, p := range map[string]*probe{"liveness": c.Liveness, "readiness": c.Readiness, "startup": c.Startup} {
		require.NotNil(t, p, name)
		require.Equal(t, c.Ports[0].Name, p.HTTPGet.Port, name)
	}
	require.Equal(t, "/healthz", c.Liveness.HTTPGet.Path)
	require.Equal(t, "/readyz", c.Readiness.HTTPGet.Path)
	def, err := loadConfig(map[string]string{})
	require.NoError(t, err)
	require.Greater(t, time.Duration(c.Startup.PeriodSeconds*c.Startup.FailureThreshold)*time.Second, def.ConnectTimeout,
		"start-up may wait CONNECT_TIMEOUT before liveness counts")
	require.NotEmpty(t, c.Resources.Requests["cpu"])
	require.NotEmpty(t, c.Resources.Requests["memory"])
	require.NotEmpty(t, c.Resources.Limits["memory"])
}
