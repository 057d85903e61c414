package observe_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxmq/inboxmq/internal/observe"
)

// Example serves /metrics, /healthz and /readyz: the broker check fails, so
// the worker is not ready, while a degraded Redis alone would keep it ready;
// the consumer has held a delivery for ten minutes without settling it, past
// the watchdog's threshold, so it is not live either. Each failing check
// says why, since when and, for the watchdog, its threshold.
func Example() {
	reg := prometheus.NewRegistry()
	consuming := false
	stuckSince := time.Now().Add(-10 * time.Minute)
	srv := observe.NewServer(&observe.ServerConfig{
		Addr:     "127.0.0.1:0", // a free port; the default is 127.0.0.1:9464
		Gatherer: reg,
		Checks: []observe.Check{
			observe.Ready("broker", func() bool { return consuming }),
			observe.DegradedFlag("redis", func() bool { return true }),
		},
		Liveness: []observe.Check{
			observe.Watchdog("consumer", func() (int, time.Time) { return 1, stuckSince }, 5*time.Minute),
		},
	})
	ctx := context.Background()
	if err := srv.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = srv.Stop(ctx) }()

	for _, path := range []string{"/healthz", "/readyz"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+srv.Addr()+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		var body struct {
			Status string
			Checks map[string]observe.CheckResult
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		_ = resp.Body.Close()
		fmt.Println(path, resp.StatusCode, body.Status)
		for _, name := range slices.Sorted(maps.Keys(body.Checks)) {
			c := body.Checks[name]
			fmt.Printf("  %s: ok=%v degraded=%v since=%v threshold=%q error=%q\n", name, c.OK, c.Degraded, c.Since != nil, c.Threshold, c.Error)
		}
	}
	// Output:
	// /healthz 503 failing
	//   consumer: ok=false degraded=false since=true threshold="5m0s" error="observe: consumer: 1 deliveries in flight and none settled for 10m0s"
	// /readyz 503 not_ready
	//   broker: ok=false degraded=false since=true threshold="" error="observe: broker not ready"
	//   redis: ok=false degraded=true since=true threshold="" error="observe: redis degraded"
}
