// Command inboxctl is the operator's tool for inboxmq: it inspects the
// inbox, lists stale claims, reconciles, replays and purges dead letters,
// applies retention, and flips the runtime controls (pause, concurrency,
// blocked keys) that running workers pick up within 2 seconds.
//
// Connection settings come from --database-url / DATABASE_URL and
// --amqp-url / AMQP_URL; credentials never appear in its output. Every
// command takes --output json for scripts. Exit codes: 0 success, 1 failure,
// 2 usage error, 3 not found. Run inboxctl --help, or see
// docs/operations.md for the runbook.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}
