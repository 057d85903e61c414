// Package observe serves a worker's operational endpoints on one small HTTP
// server: /metrics for Prometheus, /healthz for liveness and /readyz for
// readiness.
//
// # Endpoints
//
//   - /metrics serves a prometheus.Gatherer (OpenMetrics when asked, so the
//     trace-id exemplars of the latency histograms reach Prometheus).
//   - /healthz answers 200 while the process runs: restart it only if this
//     fails.
//   - /readyz runs the [Check] list concurrently, bounded by a timeout, and
//     answers 200 when every check passes, 503 otherwise, with a JSON body
//     that names each check. A check marked Degraded (Redis: correctness
//     holds without it) never makes the worker unready; it turns the status
//     into "degraded".
//
// # Wiring
//
//	srv := observe.NewServer(&observe.ServerConfig{
//		Addr:     ":9464", // defaults to 127.0.0.1:9464
//		Gatherer: reg,
//		Checks: []observe.Check{
//			observe.Ready("broker", c.Ready),     // connected and consuming
//			observe.Ping("database", pool),       // PostgreSQL reachable
//			observe.DegradedFlag("redis", m.RedisDegraded),
//		},
//	})
//	go srv.ListenAndServe(ctx) // stops when ctx is done
//
// The server listens on loopback unless configured otherwise, so metrics
// are never exposed by accident.
package observe
