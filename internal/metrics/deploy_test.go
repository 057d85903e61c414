package metrics_test

import (
	"os"
	"regexp"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/metrics"
)

// TestDeployReferencesKnownSeries keeps deploy/ in step with this package:
// every inboxmq_* series the alert rules or the dashboard query must be one
// that New registers.
func TestDeployReferencesKnownSeries(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, &metrics.Config{Inbox: &metrics.InboxConfig{DB: failingDB{}, MinInterval: -1}})
	require.NoError(t, err)
	m.Init("q", "c")
	m.InitBreaker("q", "d")
	m.InitHeld("c")
	mfs, err := reg.Gather()
	require.NoError(t, err)
	known := map[string]bool{}
	for _, mf := range mfs {
		known[mf.GetName()] = true
		for _, suffix := range []string{"_bucket", "_count", "_sum"} {
			known[mf.GetName()+suffix] = true
		}
	}

	series := regexp.MustCompile(`inboxmq_[a-z_]+`)
	for _, f := range []string{
		"../../deploy/prometheus/alerts.yml",
		"../../deploy/prometheus/alerts_test.yml",
		"../../deploy/grafana/dashboards/inboxmq.json",
	} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		var found []string
		for _, name := range series.FindAllString(string(b), -1) {
			require.True(t, known[name], "%s names unknown series %s", f, name)
			found = append(found, name)
		}
		require.NotEmpty(t, found, f)
	}
}
