package inboxmq

import (
	"context"
	"log/slog"
	"time"

	"github.com/inboxmq/inboxmq/internal/amqpdial"
	"github.com/inboxmq/inboxmq/internal/topolint"
)

// lintTimeout bounds the start-up topology lint.
const lintTimeout = 3 * time.Second

// lintRoutes returns what the topology lint needs of the routes: their
// queues as the consumer declares them, their attempts and the longest a
// delivery may run.
func (w *Worker) lintRoutes(routes []*route) []topolint.Route {
	var longest time.Duration
	if w.s.HandlerTimeout > 0 {
		longest = w.s.HandlerTimeout
	}
	out := make([]topolint.Route, 0, len(routes))
	for _, rt := range routes {
		lr := topolint.Route{LongestRun: longest}
		if a, ok := rt.policy().(interface{ Attempts() int }); ok {
			lr.Attempts = a.Attempts()
		}
		for _, q := range w.router.Topology(rt.queue) {
			lr.Queues = append(lr.Queues, topolint.Queue{Name: q.Name, Role: q.Role, Args: q.Args, Consumed: q.Consumed})
		}
		out = append(out, lr)
	}
	return out
}

// lintTopology is the start-up topology lint: it reads the routes' queues
// and the policies on them from the management API and logs what silently
// loses or loops messages. It never fails the start: an API that does not
// answer is logged at info.
func (w *Worker) lintTopology(ctx context.Context, routes []topolint.Route) {
	mgmt, vhost, err := w.managementURL()
	if err == nil {
		var api *topolint.API
		if api, err = topolint.NewAPI(mgmt, "", ""); err == nil {
			ctx, cancel := context.WithTimeout(ctx, lintTimeout)
			defer cancel()
			var found []topolint.Finding
			if found, err = topolint.Lint(ctx, api, vhost, routes); err == nil {
				w.logFindings(ctx, found)
				return
			}
		}
	}
	w.logger.LogAttrs(ctx, slog.LevelInfo, "topology lint skipped: the management API did not answer (Config.ManagementURL; inboxctl lint runs the same checks)",
		slog.Any("error", err))
}

func (w *Worker) logFindings(ctx context.Context, found []topolint.Finding) {
	if len(found) == 0 {
		w.logger.LogAttrs(ctx, slog.LevelInfo, "topology lint: the routes' queues and policies lose and loop nothing")
		return
	}
	for _, f := range found {
		level := slog.LevelWarn
		if f.Severity == topolint.Error {
			level = slog.LevelError
		}
		w.logger.LogAttrs(ctx, level, "topology lint: "+f.Message,
			slog.String("queue", f.Queue), slog.String("rule", f.Rule), slog.String("severity", f.Severity))
	}
}

// managementURL is Config.ManagementURL, or the one derived from the first
// broker node's URL, and the vhost of the broker URL.
func (w *Worker) managementURL() (mgmt, vhost string, err error) {
	nodes, err := amqpdial.Parse(w.s.URL)
	if err != nil {
		return "", "", err
	}
	mgmt, vhost, err = topolint.ManagementURL(nodes[0].URL)
	if w.s.ManagementURL != "" {
		mgmt = w.s.ManagementURL
	}
	return mgmt, vhost, err
}
