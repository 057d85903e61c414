package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inboxmq/inboxmq/internal/middleware"
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
	// FaultRedisRestart when RestartRedis is set, FaultPGRestart when
	// RestartPostgres is).
	Faults []string
	// Scenarios are run in order. Defaults to ScenarioInbox then
	// ScenarioGateway.
	Scenarios []string
	// RestartRedis runs the workers on a Redis server of the run's own (a
	// free loopback port, a folder in the run's work directory, stopped by
	// its PID at the end) instead of RedisURL, and adds FaultRedisRestart,
	// which kills that server and starts it again: a server the run did
	// not start is never restarted. It needs redis-server on the PATH.
	// Defaults to false.
	RestartRedis bool
	// RestartPostgres runs the workers and the run's checks on a
	// PostgreSQL server of the run's own (internal/pgserver: a temporary
	// folder, a free loopback port, stopped by its PID at the end) instead
	// of DatabaseURL, and adds FaultPGRestart, which stops that server
	// (fast shutdown) and starts it again: a server the run did not start
	// is never restarted. It needs the PostgreSQL server binaries.
	// Defaults to false.
	RestartPostgres bool
	// Concurrency is each worker's WORKER_CONCURRENCY. Defaults to 8.
	Concurrency int
	// GroupCommit runs the workers with GROUP_COMMIT=on: deliveries handled
	// at once share one transaction (in the gateway scenario, their
	// completions). Defaults to false.
	GroupCommit bool
	// Lock is each worker's LOCK: "on" puts every delivery behind the
	// Redis lock, so that FaultStop and a Redis fault also take locks from
	// workers still holding them; "off" pins it off. Defaults to "", the
	// worker's default (auto: no lock).
	Lock string
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
	// AMQPURL is the broker: one URL, or the comma-separated URLs of a
	// cluster's nodes. The workers get it as AMQP_URL; the runner connects
	// to the first node that answers and moves to another when its node
	// goes away. Defaults to amqp://guest:guest@127.0.0.1:5672/.
	AMQPURL string
	// DatabaseURL is the database in which each scenario creates its own
	// schema. Defaults to postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable.
	DatabaseURL string
	// RedisURL is the workers' Redis. Defaults to redis://127.0.0.1:6379/0;
	// ignored with RestartRedis.
	RedisURL string
	// WorkerAMQPURL, WorkerDatabaseURL and WorkerRedisURL are what the
	// workers get when it differs from what the runner uses: the TLS
	// listeners of the same servers, for example. The runner still adds the
	// schema's search_path to WorkerDatabaseURL. Default to AMQPURL,
	// DatabaseURL and RedisURL.
	WorkerAMQPURL, WorkerDatabaseURL, WorkerRedisURL string
	// WorkerEnv is added to each worker's environment, after the runner's
	// own settings (so it can override them): SSL_CERT_FILE, for example.
	// Defaults to nothing.
	WorkerEnv []string
	// QueueType is each worker's QUEUE_TYPE (quorum or classic). Defaults
	// to "", which leaves the worker's default.
	QueueType string
	// GatewayDelay is added to every call of the fake gateway, all run
	// long (gateway scenario): a steady, slow outside call that bounds the
	// workers' throughput, so a backlog lasts through a long fault.
	// Defaults to 0.
	GatewayDelay time.Duration
	// Failover, when set, replaces the worker faults: the orders are
	// published at once as a backlog, the copies of each order side by
	// side (so that they race each other for the lock and the claim), and
	// Failover.Inject breaks the servers once, mid-drain. Defaults to nil
	// (the seeded worker faults).
	Failover *Failover
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
	if out.Faults == nil && out.Failover == nil {
		out.Faults = slices.Clone(AllFaults)
		if out.RestartRedis {
			out.Faults = append(out.Faults, FaultRedisRestart)
		}
		if out.RestartPostgres {
			out.Faults = append(out.Faults, FaultPGRestart)
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
	out.WorkerAMQPURL = cmp.Or(out.WorkerAMQPURL, out.AMQPURL)
	out.WorkerDatabaseURL = cmp.Or(out.WorkerDatabaseURL, out.DatabaseURL)
	out.WorkerRedisURL = cmp.Or(out.WorkerRedisURL, out.RedisURL)
	if out.Failover != nil {
		f := *out.Failover
		if f.After == 0 {
			f.After = 0.25
		}
		out.Failover = &f
	}
	if out.Log == nil {
		out.Log = io.Discard
	}
	out.Log = &lockedWriter{w: out.Log}
	return out
}

// Failover is a fault injected into the servers once per scenario, in the
// middle of the drain of a backlog: a broker node killed, the brokers
// restarted one by one, the database's standby promoted, Redis failed over.
// The run measures how long consumption stopped around it and what the
// workers' metrics counted, then judges the run as always.
type Failover struct {
	// Name names the fault in the report ("kill-leader").
	Name string
	// After is the share of the orders (between 0 and 1) that have their
	// ledger entry when the fault is injected. Defaults to 0.25.
	After float64
	// Inject breaks the servers and returns once the fault is over (a
	// standby promoted, three brokers restarted in turn; a killed node may
	// stay down), with a line saying what it did. It runs on the goroutine
	// that called [Run].
	Inject func(ctx context.Context, run FailoverRun) (detail string, err error)
}

// FailoverRun is what a Failover's Inject may act on.
type FailoverRun struct {
	// Queue is the scenario's work queue (a quorum queue's leader can be
	// looked up by its name).
	Queue string
	// RunID is part of every Redis key of the run (see FlushRedisKeys).
	RunID string
	// Redis is the runner's client of Config.RedisURL.
	Redis redis.UniversalClient
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
		if !slices.Contains(AllFaults, f) && f != FaultRedisRestart && f != FaultPGRestart {
			return fmt.Errorf("chaos: unknown fault %q", f)
		}
		if f == FaultRedisRestart && !c.RestartRedis {
			return errors.New("chaos: fault redis-restart needs RestartRedis")
		}
		if f == FaultPGRestart && !c.RestartPostgres {
			return errors.New("chaos: fault pg-restart needs RestartPostgres")
		}
	}
	if f := c.Failover; f != nil {
		if f.Name == "" || f.Inject == nil {
			return errors.New("chaos: a Failover needs a Name and an Inject function")
		}
		if f.After <= 0 || f.After >= 1 {
			return fmt.Errorf("chaos: Failover.After %v: want a share of the orders between 0 and 1", f.After)
		}
		if len(c.Faults) > 0 {
			return errors.New("chaos: Failover replaces the worker faults: leave Faults empty")
		}
	}
	if c.GatewayDelay < 0 {
		return errors.New("chaos: GatewayDelay must not be negative")
	}
	switch c.Lock {
	case "", "auto", "on", "off":
	default:
		return fmt.Errorf("chaos: unknown Lock %q (want auto, on or off)", c.Lock)
	}
	switch c.QueueType {
	case "", "quorum", "classic":
	default:
		return fmt.Errorf("chaos: unknown QueueType %q (want quorum or classic)", c.QueueType)
	}
	for _, s := range c.Scenarios {
		if s != ScenarioInbox && s != ScenarioGateway {
			return fmt.Errorf("chaos: unknown scenario %q", s)
		}
	}
	return nil
}
