package relay

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg  Config
		want string // substring of the error; empty: valid
	}{
		"defaults":        {Config{URL: "amqp://guest:guest@127.0.0.1:5672/"}, ""},
		"no url":          {Config{}, "URL is required"},
		"bad url":         {Config{URL: "http://user:s3cret@host/"}, "must use amqp:// or amqps://"},
		"batch":           {Config{URL: "amqp://h/", BatchSize: -1}, "BatchSize"},
		"retention":       {Config{URL: "amqp://h/", Retention: -2}, "Retention"},
		"retention off":   {Config{URL: "amqp://h/", Retention: -1}, ""},
		"gather":          {Config{URL: "amqp://h/", GatherDelay: -2}, "GatherDelay"},
		"gather off":      {Config{URL: "amqp://h/", GatherDelay: -1}, ""},
		"negative poll":   {Config{URL: "amqp://h/", PollInterval: -time.Second}, "PollInterval"},
		"retry inverted":  {Config{URL: "amqp://h/", RetryMinDelay: time.Minute, RetryMaxDelay: time.Second}, "RetryMaxDelay"},
		"reconnect order": {Config{URL: "amqp://h/", ReconnectMinDelay: time.Minute, ReconnectMaxDelay: time.Second}, "ReconnectMaxDelay"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := tc.cfg.withDefaults()
			err := c.validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "s3cret")
		})
	}
}

func TestNewRelayConfig(t *testing.T) {
	t.Parallel()
	_, err := New(nil, &Config{URL: "amqp://h/"})
	require.Error(t, err)

	b := setup(t)
	_, err = New(b.pool, nil)
	require.ErrorContains(t, err, "URL is required")

	reg := prometheus.NewRegistry()
	r1, err := New(b.pool, &Config{URL: "amqp://h/", Registerer: reg})
	require.NoError(t, err)
	r2, err := New(b.pool, &Config{URL: "amqp://h/", Registerer: reg})
	require.NoError(t, err, "relays share a registerer")
	require.Same(t, r1.metrics.published, r2.metrics.published)
	require.Equal(t, 100, r1.cfg.BatchSize)
	require.Equal(t, 24*time.Hour, r1.cfg.Retention)
	require.Equal(t, 10*time.Millisecond, r1.cfg.GatherDelay)
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	require.Equal(t, "amqp://guest:xxxxx@host:5672/vh", redactURL("amqp://guest:s3cret@host:5672/vh"))
	require.Equal(t, "<unparseable url>", redactURL("amqp://%zz"))
	require.Equal(t, "amqp://a:xxxxx@h1:5672/,amqps://b:xxxxx@h2/", redactURL("amqp://a:p1@h1:5672/, amqps://b:p2@h2/"))
}

func TestRetryDelay(t *testing.T) {
	t.Parallel()
	r := &Relay{cfg: Config{RetryMinDelay: time.Second, RetryMaxDelay: 5 * time.Second}}
	for attempt, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 4: 5 * time.Second, 40: 5 * time.Second} {
		require.Equal(t, want, r.retryDelay(attempt), "attempt %d", attempt)
	}
}
