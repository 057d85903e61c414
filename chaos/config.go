package chaos

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/inboxmq/inboxmq/middleware"
)

// Scenario names.
const (
	// ScenarioInbox runs the workers without GATEWAY_URL: every effect is a
	// PostgreSQL write inside the inbox transaction.
	ScenarioInbox = "inbox"
	// ScenarioGateway runs the workers with the recording fake gateway as
	// GATEWAY_URL: each payment is also charged outside PostgreSQL.
	ScenarioGateway = "gateway"
)

// Config configures a chaos [Run]. A nil *Config means defaults.
type Config struct {
	// Seed drives every random choice (orders, copies, the fault schedule,
	// the gateway's failures). Defaults to one drawn from the clock; it is
	// printed so a failing run can be replayed.
	Seed uint64
	// Orders is the number of distinct orders per scenario. Defaults to 200.
	Orders int
	// Workers is the number of worker subprocesses. Defaults to 3.
	Workers int
	// Duration is how long faults are injected per scenario (orders are
	// published over its first 80 %). The time the injections themselves
	// take (rabbitmqctl, a worker's restart) does not count against it, up
	// to one more Duration. Defaults to 30s.
	Duration time.Duration
	// FaultEvery is the mean pause between two faults. Defaults to 2s.
	FaultEvery time.Duration
	// Faults are the fault kinds drawn from. Defaults to AllFaults (plus
	// FaultRedisRestart when RestartRedis is set).
	Faults []string
	// Scenarios are run in order. Defaults to ScenarioInbox then
	// ScenarioGateway.
	Scenarios []string
	// RestartRedis lets the run shut the shared Redis server down and start
	// it again (FaultRedisRestart). It disturbs everything else using that
	// Redis, so it is for the full-size run only. Defaults to false.
	RestartRedis bool
	// Concurrency is each worker's WORKER_CONCURRENCY. Defaults to 8.
	Concurrency int
	// GroupCommit runs the workers with GROUP_COMMIT=on: deliveries handled
	// at once share one transaction (in the gateway scenario, their
	// completions). Defaults to false.
	GroupCommit bool
	// LockTTL is each worker's LOCK_TTL; FaultStop pauses a worker for
	// LockTTL + 1s. Defaults to 2s.
	LockTTL time.Duration
	// DrainTimeout bounds the wait for every order to settle once the
	// faults stop. Defaults to 2m.
	DrainTimeout time.Duration
	// Binary is a built payment-worker. Defaults to building one from
	// RepoRoot into WorkDir.
	Binary string
	// RepoRoot is the module root used to build the worker. Defaults to the
	// directory holding go.mod above the working directory.
	RepoRoot string
	// WorkDir holds the binary and the workers' logs. Defaults to a new
	// temporary directory, removed after a passing run unless Keep is set.
	WorkDir string
	// AMQPURL is the broker. Defaults to amqp://guest:guest@127.0.0.1:5672/.
	AMQPURL string
	// DatabaseURL is the database in which each scenario creates its own
	// schema. Defaults to postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable.
	DatabaseURL string
	// RedisURL is the workers' Redis. Defaults to redis://127.0.0.1:6379/0.
	RedisURL string
	// Keep keeps the schemas, queues and logs of the run. Defaults to false.
	Keep bool
	// Log receives progress lines, one Write per line; Run serialises the
	// writes of its goroutines. Defaults to nil, which discards them.
	Log io.Writer
}

func (c *Config) withDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Seed == 0 {
		out.Seed = uint64(time.Now().UnixNano())
	}
	out.Orders = cmp.Or(out.Orders, 200)
	out.Workers = cmp.Or(out.Workers, 3)
	out.Duration = cmp.Or(out.Duration, 30*time.Second)
	out.FaultEvery = cmp.Or(out.FaultEvery, 2*time.Second)
	if out.Faults == nil {
		out.Faults = slices.Clone(AllFaults)
		if out.RestartRedis {
			out.Faults = append(out.Faults, FaultRedisRestart)
		}
	}
	if out.Scenarios == nil {
		out.Scenarios = []string{ScenarioInbox, ScenarioGateway}
	}
	out.Concurrency = cmp.Or(out.Concurrency, 8)
	out.LockTTL = cmp.Or(out.LockTTL, 2*time.Second)
	out.DrainTimeout = cmp.Or(out.DrainTimeout, 2*time.Minute)
	out.AMQPURL = cmp.Or(out.AMQPURL, "amqp://guest:guest@127.0.0.1:5672/")
	out.DatabaseURL = cmp.Or(out.DatabaseURL, "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
	out.RedisURL = cmp.Or(out.RedisURL, "redis://127.0.0.1:6379/0")
	if out.Log == nil {
		out.Log = io.Discard
	}
	out.Log = &lockedWriter{w: out.Log}
	return out
}

// lockedWriter serialises writes from the runner's goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (c *Config) validate() error {
	if c.Orders < 1 || c.Workers < 1 || c.Concurrency < 1 {
		return errors.New("chaos: Orders, Workers and Concurrency must be positive")
	}
	if c.Duration < time.Second || c.FaultEvery < 100*time.Millisecond {
		return errors.New("chaos: Duration must be ≥ 1s and FaultEvery ≥ 100ms")
	}
	if c.LockTTL < middleware.MinLockTTL || c.LockTTL > middleware.MaxLockTTL {
		return fmt.Errorf("chaos: LockTTL %s is outside the lock's range %s..%s", c.LockTTL, middleware.MinLockTTL, middleware.MaxLockTTL)
	}
	for _, f := range c.Faults {
		if !slices.Contains(AllFaults, f) && f != FaultRedisRestart {
			return fmt.Errorf("chaos: unknown fault %q", f)
		}
		if f == FaultRedisRestart && !c.RestartRedis {
			return errors.New("chaos: fault redis-restart needs RestartRedis")
		}
	}
	for _, s := range c.Scenarios {
		if s != ScenarioInbox && s != ScenarioGateway {
			return fmt.Errorf("chaos: unknown scenario %q", s)
		}
	}
	return nil
}
