package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/ui"
)

// uiReady, when set by a test, receives the listening address.
var uiReady func(addr string)

// loopback reports whether addr's host is a loopback address or name.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// parseQueues reads --queue values: NAME or NAME=NAMESPACE.
func parseQueues(vals []string, tiers []time.Duration) ([]ui.Queue, error) {
	out := make([]ui.Queue, 0, len(vals))
	for _, v := range vals {
		name, ns, _ := strings.Cut(v, "=")
		if !consumer.ValidName(name) {
			return nil, usagef("--queue %q: invalid queue name", v)
		}
		out = append(out, ui.Queue{Name: name, Namespace: ns, RetryTiers: tiers})
	}
	return out, nil
}

func (c *cli) uiCmd() *cobra.Command {
	var (
		addr, token, base string
		queues            []string
		tiers             []time.Duration
		allowRemote       bool
	)
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the operator web console (loopback by default)",
		Long: `ui serves the operator console: an overview of every queue (inbox rows by
status, oldest and stale claims, retry-tier, DLQ and parked depths, pause and
concurrency, outbox backlog), the inbox search, stale claims with reconcile,
dead letters grouped by reason with replay and purge, and the runtime
controls.

Reading needs nothing; every change needs the operator token: --token,
else $INBOXCTL_UI_TOKEN, else one generated and printed once at start.
Every change is written as an audit line on stderr. The console listens on
loopback; another address needs --allow-remote (put TLS in front of it).

--queue names a work queue (repeat it), NAME or NAME=NAMESPACE when the
handler's inbox namespace differs; without it, every namespace found in the
inbox is shown.`,
		Example: `  inboxctl ui --queue payments --queue emails
  INBOXCTL_UI_TOKEN=... inboxctl ui --addr 127.0.0.1:9470`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !loopback(addr) && !allowRemote {
				return usagef("--addr %s is not a loopback address: add --allow-remote to listen there", addr)
			}
			qs, err := parseQueues(queues, tiers)
			if err != nil {
				return err
			}
			if token == "" {
				token = c.getenv("INBOXCTL_UI_TOKEN")
			}
			generated := token == ""
			if generated {
				token = rand.Text()
			}
			amqpURL, _ := c.brokerURL()
			ctx := cmd.Context()
			pool, err := c.openDB(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			logger := slog.New(slog.NewJSONHandler(c.errOut, nil))
			con, err := ui.New(&ui.Config{
				DB: pool, AMQPURL: amqpURL, Queues: qs, Token: token, Logger: logger, BasePath: base,
			})
			if err != nil {
				return usageError{err}
			}
			defer con.Close()
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("listen %s: %w", addr, err)
			}
			var h http.Handler = con
			if base != "" {
				mux := http.NewServeMux()
				mux.Handle(strings.TrimRight(base, "/")+"/", http.StripPrefix(strings.TrimRight(base, "/"), con))
				h = mux
			}
			srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
			fmt.Fprintf(c.errOut, "inboxctl ui: serving on http://%s%s/\n", ln.Addr(), base)
			if generated {
				fmt.Fprintf(c.errOut, "inboxctl ui: operator token (printed once): %s\n", token)
			}
			if uiReady != nil {
				uiReady(ln.Addr().String())
			}
			errc := make(chan error, 1)
			go func() { errc <- srv.Serve(ln) }()
			select {
			case err := <-errc:
				return err
			case <-ctx.Done():
			}
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := srv.Shutdown(sctx); err != nil {
				return fmt.Errorf("shutdown: %w", err)
			}
			if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", "127.0.0.1:9470", "listen address (loopback unless --allow-remote)")
	f.StringVar(&token, "token", "", "operator token (default $INBOXCTL_UI_TOKEN, else generated and printed)")
	f.StringSliceVar(&queues, "queue", nil, "work queue to show, NAME or NAME=NAMESPACE (repeatable; default: every namespace in the inbox)")
	f.DurationSliceVar(&tiers, "retry-tiers", nil, "the queues' broker delay tiers (default: inboxmq's defaults)")
	f.StringVar(&base, "base-path", "", "path prefix the console is served under behind a proxy")
	f.BoolVar(&allowRemote, "allow-remote", false, "allow a non-loopback --addr")
	return cmd
}
