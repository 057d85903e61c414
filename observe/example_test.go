package observe_test

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxmq/inboxmq/observe"
)

// Example serves /metrics, /healthz and /readyz: the broker check fails, so
// the worker is not ready, while a degraded Redis alone would keep it ready.
func Example() {
	reg := prometheus.NewRegistry()
	consuming := false
	srv := observe.NewServer(&observe.ServerConfig{
		Addr:     "127.0.0.1:0", // a free port; the default is 127.0.0.1:9464
		Gatherer: reg,
		Checks: []observe.Check{
			observe.Ready("broker", func() bool { return consuming }),
			observe.DegradedFlag("redis", func() bool { return true }),
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
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		fmt.Print(path, " ", resp.StatusCode, " ", string(body))
	}
	// Output:
	// /healthz 200 {"status":"ok"}
	// /readyz 503 {"status":"not_ready","checks":{"broker":{"ok":false,"error":"observe: broker not ready"},"redis":{"ok":false,"degraded":true,"error":"observe: redis degraded"}}}
}
