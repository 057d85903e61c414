// Command inboxchaos runs inboxmq's chaos suite (package chaos) against the
// payment-worker example and prints a table of the scenarios with their
// figures. It exits 1 if any guarantee was broken, 2 if the run could not be
// carried out.
//
//	go run ./cmd/inboxchaos -seed 42 -orders 500 -workers 4 -duration 60s
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/inboxmq/inboxmq/internal/chaos"
)

func main() {
	var (
		cfg       chaos.Config
		faults    string
		scenarios string
	)
	flag.Uint64Var(&cfg.Seed, "seed", 0, "seed of every random choice (0: from the clock; printed for replay)")
	flag.IntVar(&cfg.Orders, "orders", 200, "distinct orders per scenario")
	flag.IntVar(&cfg.Workers, "workers", 3, "worker subprocesses")
	flag.DurationVar(&cfg.Duration, "duration", 30*time.Second, "fault phase per scenario")
	flag.DurationVar(&cfg.FaultEvery, "fault-every", 2*time.Second, "mean pause between faults")
	flag.StringVar(&faults, "faults", "", "comma-separated faults (default: all but redis-restart): "+strings.Join(chaos.AllFaults, ","))
	flag.StringVar(&scenarios, "scenarios", "", "comma-separated scenarios (default: inbox,gateway)")
	flag.BoolVar(&cfg.RestartRedis, "restart-redis", false, "run the workers on a Redis server of the run's own (a free port) and restart it as a fault; the shared Redis is never restarted")
	flag.BoolVar(&cfg.RestartPostgres, "restart-postgres", false, "run the workers on a PostgreSQL server of the run's own (a free port) and restart it as a fault; the shared PostgreSQL is never restarted")
	flag.IntVar(&cfg.Concurrency, "concurrency", 8, "WORKER_CONCURRENCY of each worker")
	flag.BoolVar(&cfg.GroupCommit, "group-commit", false, "run the workers with GROUP_COMMIT=on")
	flag.StringVar(&cfg.Lock, "lock", "", "LOCK of each worker: auto, on or off (default: the worker's, auto)")
	flag.DurationVar(&cfg.LockTTL, "lock-ttl", 2*time.Second, "LOCK_TTL of each worker")
	flag.DurationVar(&cfg.DrainTimeout, "drain-timeout", 2*time.Minute, "bound on the drain after the faults")
	flag.StringVar(&cfg.Binary, "binary", "", "a built payment-worker (default: build one)")
	flag.StringVar(&cfg.AMQPURL, "amqp-url", os.Getenv("AMQP_URL"), "broker URL")
	flag.StringVar(&cfg.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "database URL (each scenario creates its own schema)")
	flag.StringVar(&cfg.RedisURL, "redis-url", os.Getenv("REDIS_URL"), "Redis URL of the workers")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep schemas, queues and logs")
	flag.Parse()
	if faults != "" {
		cfg.Faults = strings.Split(faults, ",")
	}
	if scenarios != "" {
		cfg.Scenarios = strings.Split(scenarios, ",")
	}
	cfg.Log = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := chaos.Run(ctx, &cfg)
	if rep != nil {
		rep.WriteTable(os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "inboxchaos:", err)
		os.Exit(2)
	}
	if !rep.OK() {
		os.Exit(1)
	}
}
