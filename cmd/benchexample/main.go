// Command benchexample measures the payment-worker example as it is
// deployed, its binary at its defaults and with GROUP_COMMIT=on, against
// a hand-written loop doing the same writes (issue #35), on the local
// RabbitMQ, PostgreSQL and Redis:
//
//	(hand loop)                       amqp091 + pgx, 8 handlers, prefetch 16,
//	                                  one transaction per delivery: inbox row,
//	                                  payment, ledger entry, outbox row
//	(payment-worker defaults)         `payment-worker run`, settings unset
//	(payment-worker GROUP_COMMIT=on)  the same with GROUP_COMMIT=on
//
// Each drain gets a fresh schema (filled by the worker's `migrate`) and a
// fresh queue (declared by a first start of the worker, stopped once
// ready); -n persistent payments are published with confirms before the
// consumer starts. The drain is timed from the consumer's start (the
// process's exec, for the worker) until the schema holds -n payments rows
// and, for the worker, its relay has sent every outbox row (polled every
// 10 ms). The variants' drains are interleaved, -runs rounds; it prints
// each round, the median rates and the ratios of the medians.
//
//	go run ./cmd/benchexample -n 20000 -runs 3
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
)

// variant is one consumer of the comparison.
type variant struct {
	id   string   // in schema and queue names
	name string   // as printed
	env  []string // the worker's settings (the declaring start's, for the hand loop)
	hand bool
}

var variants = []variant{
	{id: "hand", name: "hand loop", hand: true},
	{id: "defaults", name: "payment-worker defaults"},
	{id: "group", name: "payment-worker GROUP_COMMIT=on", env: []string{"GROUP_COMMIT=on"}},
}

// drain is one variant's result in one round.
type drain struct {
	elapsed time.Duration
	rate    float64       // payments per second
	startup time.Duration // the declaring start's exec to /readyz
}

func main() {
	var (
		n        = flag.Int("n", 20000, "payments queued before each consumer starts")
		runs     = flag.Int("runs", 3, "rounds of the three variants (medians are reported)")
		timeout  = flag.Duration("timeout", 10*time.Minute, "bound on one drain")
		amqpURL  = flag.String("amqp", cmp.Or(os.Getenv("AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/"), "broker")
		dbURL    = flag.String("db", cmp.Or(os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"), "database (a schema of each drain's own)")
		redisURL = flag.String("redis", cmp.Or(os.Getenv("REDIS_URL"), "redis://127.0.0.1:6379/0"), "the worker's Redis")
	)
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("benchexample: ")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, &bench{amqpURL: *amqpURL, dbURL: *dbURL, redisURL: *redisURL, n: *n, timeout: *timeout}, *runs); err != nil {
		stop()
		log.Fatal(err)
	}
}

func run(ctx context.Context, b *bench, runs int) (err error) {
	if b.dir, err = os.MkdirTemp("", "benchexample-"); err != nil {
		return err
	}
	defer os.RemoveAll(b.dir)
	log.Printf("building the payment-worker")
	if b.bin, err = buildWorker(ctx, b.dir); err != nil {
		return err
	}
	if b.admin, err = pgx.Connect(ctx, b.dbURL); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer b.admin.Close(context.Background())
	if b.conn, err = amqp.Dial(b.amqpURL); err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	defer b.conn.Close()
	ropts, err := redis.ParseURL(b.redisURL)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	b.redis = redis.NewClient(ropts)
	defer b.redis.Close()

	loadBefore := loadAvg()
	results := make([][]drain, len(variants))
	fmt.Printf("%d persistent payments queued before each consumer starts; %d rounds, variants interleaved; GOMAXPROCS=%d; %s\n\n",
		b.n, runs, runtime.GOMAXPROCS(0), runtime.Version())
	for r := range runs {
		for i, v := range variants {
			log.Printf("round %d: (%s)", r+1, v.name)
			d, err := b.measure(ctx, v, r+1)
			if err != nil {
				return fmt.Errorf("round %d, (%s): %w", r+1, v.name, err)
			}
			results[i] = append(results[i], d)
			startup := ""
			if !v.hand {
				startup = fmt.Sprintf(" (its declaring start: %s from exec to /readyz)", d.startup.Round(time.Millisecond))
			}
			fmt.Printf("round %d: (%s) %d payments in %s: %.0f msg/s%s\n", r+1, v.name, b.n, d.elapsed.Round(time.Millisecond), d.rate, startup)
		}
		hand := results[0][r].rate
		fmt.Printf("round %d: defaults/hand %.2f, GROUP_COMMIT=on/hand %.2f\n", r+1, results[1][r].rate/hand, results[2][r].rate/hand)
	}
	medians := make([]float64, len(variants))
	fmt.Println()
	for i, v := range variants {
		medians[i] = median(results[i])
		fmt.Printf("(%s): %.0f msg/s (median)\n", v.name, medians[i])
	}
	fmt.Printf("load average before: %s; after: %s (%d cores)\n\n", loadBefore, loadAvg(), runtime.NumCPU())
	fmt.Printf("- (payment-worker defaults)/(hand loop) = %.2f\n", medians[1]/medians[0])
	fmt.Printf("- (payment-worker GROUP_COMMIT=on)/(hand loop) = %.2f\n", medians[2]/medians[0])
	return nil
}

// measure runs one drain of v: a fresh fixture, b.n payments queued, the
// consumer started and timed until its effects are in, then stopped, the
// effects checked and the fixture removed.
func (b *bench) measure(ctx context.Context, v variant, round int) (d drain, err error) {
	f, err := b.newFixture(ctx, v, round)
	if err != nil {
		return d, err
	}
	defer f.close()
	d.startup = f.startup
	if err := f.publish(ctx); err != nil {
		return d, err
	}
	start := time.Now()
	var stop func() error
	var died <-chan struct{}
	if v.hand {
		h, err := startHandLoop(ctx, f)
		if err != nil {
			return d, err
		}
		stop = h.stop
	} else {
		p, err := startWorker(b.bin, f.logPath, f.env)
		if err != nil {
			return d, err
		}
		stop, died = p.stop, p.done
	}
	err = f.waitDone(ctx, !v.hand, died)
	d.elapsed = time.Since(start)
	if err = errors.Join(err, stop()); err != nil {
		return d, err
	}
	d.rate = float64(b.n) / d.elapsed.Seconds()
	return d, f.check(ctx, !v.hand)
}

func median(ds []drain) float64 {
	rates := make([]float64, len(ds))
	for i, d := range ds {
		rates[i] = d.rate
	}
	slices.Sort(rates)
	if len(rates) == 0 {
		return 0
	}
	return rates[len(rates)/2]
}

// loadAvg reads the 1, 5 and 15 minute load averages (/proc/loadavg).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}
