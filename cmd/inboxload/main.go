// Command inboxload is the payment-worker's load tool: it publishes a burst
// of payment orders, each one 1 to N times under different message ids,
// plus invalid messages, then waits until the worker has processed them
// and checks the effects: one payments row and one ledger entry per order.
// `make demo` drives it.
//
//	inboxload publish --orders 500 --max-copies 3 --invalid 5 --purge --summary demo.json
//	inboxload report --summary demo.json --metrics-url http://127.0.0.1:9464/metrics
//
// It reads the worker's variables AMQP_URL, DATABASE_URL, PAYMENT_QUEUE and
// ORDERED_SHARDS (with ORDERED_SHARDS set it publishes to the ordered
// route's exchange, the order id as routing key). report exits 1 when the
// effects are wrong; both exit 2 when they cannot run.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/caarlos0/env/v11"
)

// config holds the worker's variables the tool needs, with the worker's
// defaults.
type config struct {
	AMQPURL       string `env:"AMQP_URL" envDefault:"amqp://guest:guest@127.0.0.1:5672/"`
	DatabaseURL   string `env:"DATABASE_URL" envDefault:"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"`
	Queue         string `env:"PAYMENT_QUEUE" envDefault:"payments.requested"`
	OrderedShards int    `env:"ORDERED_SHARDS"`
}

// errFailed is report's verdict that the effects are wrong (exit status 1).
var errFailed = errors.New("inboxload: the effects do not match the orders")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := runCommand(ctx, os.Args[1:], os.Stdout)
	switch {
	case err == nil:
		return
	case errors.Is(err, errFailed):
		stop()
		os.Exit(1)
	default:
		fmt.Fprintln(os.Stderr, err)
		stop()
		os.Exit(2)
	}
}

// runCommand runs the command named by args[0] with the rest as flags.
func runCommand(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("inboxload: want a command: publish or report")
	}
	cfg, err := env.ParseAs[config]()
	if err != nil {
		return fmt.Errorf("inboxload: %w", err)
	}
	switch args[0] {
	case "publish":
		return publishCmd(ctx, cfg, args[1:], out)
	case "report":
		return reportCmd(ctx, cfg, args[1:], out)
	default:
		return fmt.Errorf("inboxload: unknown command %q: want publish or report", args[0])
	}
}
