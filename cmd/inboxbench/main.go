// Command inboxbench measures inboxmq against the ceilings of its own stack,
// in one run, on the local RabbitMQ, PostgreSQL and Redis:
//
//	(a) raw amqp091 drain, ack only            — the broker's ceiling
//	(b) hand-written loop, one tx per delivery — the per-message ceiling
//	(c) hand-written loop, batched tx          — the batched ceiling
//	(d) inboxmq, per-message transactional mode
//	(e) inboxmq, group commit
//	(eb) inboxmq, group commit through inbox.BatchHandler (HandleBatch)
//	(f) inboxmq, claim mode at the façade's default (no Redis lock)
//	(fl) (f) behind the Redis lock (RouteOpts.Lock)
//	(g) hand-written loop, claim protocol — (f)'s protocol by hand: its ceiling
//	(h) inboxmq, claim mode with group-committed completions
//	(p) the full payment chain, as examples/payment-worker wires it through
//	    inboxmq.NewWorker: block check, completed-cache (no lock, the
//	    default), replies, an outbox event per payment relayed with confirms
//	(pt) (p) with a transactional handler (HandleTx) doing the same writes
//	(pg) (p) with GROUP_COMMIT=on: GroupCommit{} and the route's default
//	    concurrency
//	(pts) (pg) with (pt)'s transactional handler: a savepoint per delivery
//	(pc) hand-written full chain — (p)'s work by hand, events pipelined: its ceiling
//	(pgc) (pc) batched 64 per transaction, 8 batches in flight — (pg)'s ceiling
//	(pgx) (pg) while another session holds a transaction open (the xmin
//	    horizon pinned): throughput, and the inbox's and outbox's dead tuples
//	(dq), (eq)  (d) and (e) again on a quorum queue (-quorum: which of
//	    d,e,f,fl,h,p,pg,pc)
//
// A chain case's drain ends when every delivery is acked and every outbox
// row is sent.
//
// For each case it drains the same number of pre-published persistent
// messages (median of -runs, the cases' runs interleaved), then measures
// publish-to-commit latency at a steady 50 % of that throughput (medians of
// -latruns runs) — and group commit's also at per-message mode's load, the
// latency it adds — and prints msgs/s, allocations and CPU per delivery, RSS
// and the ratios (d)/(b), (e)/(c), (e)/(b), (f)/(d), and (f)/(g), (fl)/(f),
// (g)/(b), (g)/(d): how close claim mode comes to its own protocol's
// ceiling, and what the protocol itself costs against one transaction per
// delivery — (g)/(d) bounds what (f)/(d) can reach — and what the Redis lock
// costs claim mode; and (h)/(e), (h)/(d): claim mode with group commit
// against transactional mode with and without it; (p)/(d), (p)/(pc),
// (pg)/(d) and (pg)/(p): the full chain against the bare inbox and its own
// ceiling, and group commit on against off on it; (pg)/(pgc), the
// group-committed chain against its own ceiling, and (pgx)/(pg), what a
// pinned xmin horizon costs it; and (dq)/(d), (eq)/(e): what a quorum queue
// costs against a classic one.
//
// With (p), it then publishes to (p) at a steady 800 msg/s for a minute
// (-critical, -criticalrate) and reports the p50 and p99 of its
// critical-time histogram; with (pc), (pc) then runs at the same rate, its
// p50 and p99 beside them: the ceiling of that tail.
//
// Every case also gets its round trips per delivery to PostgreSQL and Redis,
// and the broker's packets in and out (roundtrips.go says how each is
// counted). Pointed at one node of a RabbitMQ cluster (-amqp), the quorum
// cases replicate every message to the other nodes.
//
//	go run ./cmd/inboxbench -n 20000 -runs 3
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/migrations"
)

// runner starts a consumer on queue; done is called once per delivery after
// its effect is committed and it is acked, with the message's publish time.
// The returned stop function stops it.
type runner func(ctx context.Context, queue string, done func(publishedAt time.Time)) (stop func() error, err error)

type benchCase struct {
	id, name string
	// queueType is the type of the queue the case drains: the inboxmq
	// cases declare their own topology, which must match.
	queueType consumer.QueueType
	run       runner
	// settle, when set, waits after the last ack until the case's work is
	// done (the chain cases: every outbox row sent); the drain's clock
	// stops after it.
	settle func(ctx context.Context, n int) error
}

type env struct {
	pool *pgxpool.Pool // counts its round trips (pgCounter)
	// admin is a pool whose round trips are not counted: the drain's own
	// checks and waits.
	admin    *pgxpool.Pool
	conn     *amqp.Connection
	redis    redis.UniversalClient
	amqpURL  string
	dbURL    string
	schema   string
	workers  int
	batch    int
	inflight int
	maxWait  time.Duration
	// chainBatch is the GroupCommit.MaxBatch of (pg) and (pts); 0 leaves
	// the default.
	chainBatch int
	// acked, while a chain case runs the worker, reads the worker's count
	// of acked deliveries.
	acked atomic.Pointer[func() float64]
	// registry is the metrics registry of the chain case's worker that
	// started last.
	registry atomic.Pointer[prometheus.Registry]
}

type result struct {
	c        benchCase
	rates    []float64
	allocs   float64   // per delivery
	cpuUS    float64   // CPU µs per delivery
	machines []float64 // the machine's CPU µs per delivery, servers included, per run
	rss      float64   // MiB at the end of the drain
	// Round trips per delivery, per run: PostgreSQL, Redis, and the
	// broker's packets in and out (negative: not measured).
	pgRT, redisRT, brokerIn, brokerOut []float64
	p50, p99                           time.Duration
	latencyErr                         string
	// Group commit only: latency at the load (d) carries at 50 %.
	atPerMessageRate float64
	p50d, p99d       time.Duration
}

func main() {
	var (
		n        = flag.Int("n", 20000, "messages per drain")
		runs     = flag.Int("runs", 3, "drains per case (the median is reported)")
		cases    = flag.String("cases", "a,b,c,d,e,eb,f,fl,g,h,p,pg,pgx,pc,pgc", "cases to run")
		quorum   = flag.String("quorum", "d,e", "cases (d,e,f,fl,h,p,pg,pc) to run again on a quorum queue, as (dq), (eq), …; empty for none")
		workers  = flag.Int("workers", 8, "handlers for the per-message cases")
		batch    = flag.Int("batch", 64, "deliveries per transaction in the batched cases")
		inflight = flag.Int("inflight", 4, "batches in flight in the batched cases")
		chainBat = flag.Int("chainbatch", 0, "cases (pg) and (pts): GroupCommit.MaxBatch (0: its default)")
		maxWait  = flag.Duration("maxwait", 2*time.Millisecond, "cases (e) and (h): GroupCommit.MaxWait")
		latDur   = flag.Duration("latency", 4*time.Second, "duration of each steady-load latency run (0 skips them)")
		latRuns  = flag.Int("latruns", 3, "latency runs per case (the medians of p50 and p99 are reported)")
		critDur  = flag.Duration("critical", time.Minute, "with case (p): publish to it at a steady -criticalrate for this long and report the critical-time histogram's p50 and p99 (0 skips it)")
		critRate = flag.Float64("criticalrate", 800, "the rate of the critical-time run, msg/s")
		loads    = flag.String("loads", "", "instead of the drains: publish-to-commit latency of each case at these steady rates (msg/s, comma-separated)")
		amqpURL  = flag.String("amqp", cmp.Or(os.Getenv("AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/"), "broker")
		dbURL    = flag.String("db", cmp.Or(os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"), "database")
		redisURL = flag.String("redis", cmp.Or(os.Getenv("REDIS_URL"), "redis://127.0.0.1:6379/0"), "redis")
		out      = flag.String("out", "", "also write the markdown report to this file")
		cpuProf  = flag.String("cpuprofile", "", "write a CPU profile of the drains to this file")
		tripSQL  = flag.Bool("tripsql", false, "log each drain's PostgreSQL round trips per statement")
		brokerRT = flag.Bool("brokercounts", true, "read the broker's packet counters (rabbitmqctl, about 1s before and after each drain)")
		memProf  = flag.String("memprofile", "", "write an allocation profile (all allocations) to this file at the end")
	)
	flag.Parse()
	if *critRate <= 0 {
		log.Fatal("-criticalrate must be positive")
	}
	if *tripSQL {
		bySQL = &sync.Map{}
	}
	brokerCounts = *brokerRT
	log.SetFlags(0)
	log.SetPrefix("inboxbench: ")

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
	defer cancel()
	e, err := setup(ctx, *amqpURL, *dbURL, *redisURL)
	if err != nil {
		log.Fatal(err)
	}
	defer e.close()
	e.workers, e.batch, e.inflight, e.chainBatch, e.maxWait = *workers, *batch, *inflight, *chainBat, *maxWait

	all := append([]benchCase{
		{"a", "raw amqp091 drain, ack only (broker ceiling)", consumer.Classic, rawDrain(e), nil},
		{"b", fmt.Sprintf("hand-written loop, 1 tx per delivery, %d handlers", *workers), consumer.Classic, perMessageLoop(e, *workers), nil},
		{"c", fmt.Sprintf("hand-written loop, %d per tx, %d batches in flight", *batch, *inflight), consumer.Classic, batchedLoop(e, *batch, *inflight, 2*time.Millisecond), nil},
	}, frameworkCases(e, consumer.Classic)...)
	all = append(all, chainCases(e, consumer.Classic)...)
	all = append(all, benchCase{"g", fmt.Sprintf("hand-written loop, claim protocol, %d handlers", *workers), consumer.Classic, claimLoop(e, *workers), nil})
	wantQuorum := strings.Split(*quorum, ",")
	for _, c := range append(frameworkCases(e, consumer.Quorum), chainCases(e, consumer.Quorum)...) {
		if slices.Contains(wantQuorum, strings.TrimSuffix(c.id, "q")) {
			all = append(all, c)
		}
	}
	slices.SortFunc(all, func(a, b benchCase) int { return cmp.Compare(a.id, b.id) })
	if *cpuProf != "" {
		f, err := os.Create(*cpuProf)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	if *memProf != "" {
		runtime.MemProfileRate = 4096
		defer func() {
			f, err := os.Create(*memProf)
			if err != nil {
				log.Fatal(err)
			}
			_ = pprof.Lookup("allocs").WriteTo(f, 0)
			_ = f.Close()
		}()
	}
	want := strings.Split(*cases, ",")
	var results []*result
	for _, c := range all {
		// A quorum case runs when its classic twin was asked for, or by its own id.
		if slices.Contains(want, c.id) || (c.queueType == consumer.Quorum && slices.Contains(want, strings.TrimSuffix(c.id, "q"))) {
			results = append(results, &result{c: c})
		}
	}
	if *loads != "" {
		for _, f := range strings.Split(*loads, ",") {
			rate, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil {
				log.Fatalf("-loads: %v", err)
			}
			for _, r := range results {
				p50, p99, err := latency(ctx, e, r.c, rate, *latDur)
				if err != nil {
					log.Printf("(%s) at %.0f msg/s: %v", r.c.id, rate, err)
				}
				fmt.Printf("(%s) at %.0f msg/s: p50 %s p99 %s\n", r.c.id, rate, p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond))
			}
		}
		return
	}
	// Runs are interleaved (a, b, …, f, then again), so that a machine
	// whose speed drifts during the benchmark moves every case alike and
	// the ratios stay fair.
	for i := range *runs {
		for _, r := range results {
			rate, allocs, cpu, machine, trips, err := drain(ctx, e, r.c, *n)
			if err != nil {
				log.Fatalf("case %s run %d: %v", r.c.id, i+1, err)
			}
			r.pgRT, r.redisRT = append(r.pgRT, trips.pg), append(r.redisRT, trips.redis)
			r.brokerIn, r.brokerOut = append(r.brokerIn, trips.brokerIn), append(r.brokerOut, trips.brokerOut)
			r.rates = append(r.rates, rate)
			if i == 0 || allocs < r.allocs {
				r.allocs, r.cpuUS = allocs, cpu
			}
			r.machines = append(r.machines, machine)
			r.rss = max(r.rss, rssMiB())
			log.Printf("(%s) run %d: %.0f msg/s, %.1f allocs/delivery, %.0f µs CPU/delivery, machine %.0f µs/delivery, round trips/delivery: PG %.2f, Redis %.2f, broker packets in %.2f out %.2f",
				r.c.id, i+1, rate, allocs, cpu, machine, trips.pg, trips.redis, trips.brokerIn, trips.brokerOut)
		}
	}
	if *latDur > 0 {
		var perMessage, group *result
		for _, r := range results {
			switch r.c.id {
			case "d":
				perMessage = r
			case "e":
				group = r
			}
		}
		// -latruns rounds, each case once per round (and group commit at
		// per-message mode's load right after it); medians are reported:
		// one p99 of a few thousand messages moves with a single stall of
		// this machine.
		var p50s, p99s = map[*result][]time.Duration{}, map[*result][]time.Duration{}
		var p50d, p99d []time.Duration
		for i := range *latRuns {
			for _, r := range results {
				p50, p99, err := latency(ctx, e, r.c, median(r.rates)/2, *latDur)
				if err != nil {
					r.latencyErr = err.Error()
				}
				p50s[r], p99s[r] = append(p50s[r], p50), append(p99s[r], p99)
				log.Printf("(%s) latency at 50%% load, round %d: p50 %s p99 %s", r.c.id, i+1, p50, p99)
				if r != perMessage || group == nil {
					continue
				}
				// The latency group commit adds: (e) at the load that (d)
				// carries at 50 %, against (d) itself.
				group.atPerMessageRate = median(perMessage.rates) / 2
				p50, p99, err = latency(ctx, e, group.c, group.atPerMessageRate, *latDur)
				if err != nil {
					group.latencyErr = err.Error()
				}
				p50d, p99d = append(p50d, p50), append(p99d, p99)
				log.Printf("(e) latency at (d)'s 50%% load, round %d: p50 %s p99 %s", i+1, p50, p99)
			}
		}
		for _, r := range results {
			r.p50, r.p99 = medianDuration(p50s[r]), medianDuration(p99s[r])
		}
		if group != nil {
			group.p50d, group.p99d = medianDuration(p50d), medianDuration(p99d)
		}
	}
	if *critDur > 0 && slices.Contains(want, "p") {
		line, err := criticalTime(ctx, e, *critRate, *critDur, slices.Contains(want, "pc"))
		if err != nil {
			log.Printf("critical time: %v", err)
		}
		criticalLine = line
		log.Print(line)
	}
	report(os.Stdout, results, *n, *runs, *latRuns)
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			log.Fatal(err)
		}
		report(f, results, *n, *runs, *latRuns)
		_ = f.Close()
	}
}

func setup(ctx context.Context, amqpURL, dbURL, redisURL string) (*env, error) {
	// A schema of this process's own: other runs may share the database.
	schema := "inboxbench_" + strconv.Itoa(os.Getpid())
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	_, err = c.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE; CREATE SCHEMA "+schema)
	_ = c.Close(ctx)
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 16
	admin, err := pgxpool.NewWithConfig(ctx, cfg.Copy())
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.Tracer = pgCounter{}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := migrations.Up(ctx, pool); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `
CREATE TABLE bench_payments (order_id text PRIMARY KEY, amount_cents bigint NOT NULL, currency text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE bench_ledger (id bigserial PRIMARY KEY, order_id text NOT NULL, amount_cents bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now());`); err != nil {
		return nil, err
	}
	conn, _, err := consumer.Dial(ctx, amqpURL, &consumer.DialOpts{Name: benchName})
	if err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	rdb, err := inboxmq.RedisFromURL(redisURL, nil)
	if err != nil {
		return nil, err
	}
	rdb.AddHook(redisCounter{})
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	// The chain cases' events exchange, as the worker declares it.
	err = ch.ExchangeDeclare(eventsExchange, amqp.ExchangeTopic, true, false, false, false, nil)
	_ = ch.Close()
	if err != nil {
		return nil, err
	}
	return &env{pool: pool, admin: admin, conn: conn, redis: rdb, amqpURL: amqpURL, dbURL: pgURLWithSchema(dbURL, schema), schema: schema}, nil
}

func pgURLWithSchema(u, schema string) string {
	if strings.Contains(u, "?") {
		return u + "&search_path=" + schema
	}
	return u + "?search_path=" + schema
}

func (e *env) close() {
	if ch, err := e.conn.Channel(); err == nil {
		_ = ch.ExchangeDelete(eventsExchange, false, false)
		_ = ch.Close()
	}
	_ = e.conn.Close()
	_ = e.redis.Close()
	e.pool.Close()
	_, _ = e.admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+e.schema+" CASCADE")
	e.admin.Close()
}

// reset empties the tables between drains so every case starts alike.
func (e *env) reset(ctx context.Context) error {
	_, err := e.admin.Exec(ctx, "TRUNCATE inboxmq_inbox, inboxmq_outbox, bench_payments, bench_ledger")
	return err
}

var queueSeq atomic.Int64

// benchDeliveryLimit is the quorum cases' QueueOpts.DeliveryLimit, which
// freshQueue declares alike.
const benchDeliveryLimit = 20

// freshQueue declares a new work queue of type typ, with the arguments the
// consumer declares it with (a mismatch would fail the consumer's
// declaration).
func (e *env) freshQueue(typ consumer.QueueType) (string, error) {
	q := fmt.Sprintf("inboxbench.%d.%d", os.Getpid(), queueSeq.Add(1))
	ch, err := e.conn.Channel()
	if err != nil {
		return "", err
	}
	defer ch.Close()
	args := amqp.Table{
		"x-queue-type": string(typ), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": inboxtype.DeadLetterQueue(q),
	}
	if typ == consumer.Quorum {
		args["x-delivery-limit"] = int64(benchDeliveryLimit)
		args["x-dead-letter-strategy"] = "at-least-once"
		args["x-overflow"] = "reject-publish"
	}
	_, err = ch.QueueDeclare(q, true, false, false, false, args)
	return q, err
}

func (e *env) deleteQueue(q string) {
	ch, err := e.conn.Channel()
	if err != nil {
		return
	}
	defer ch.Close()
	for _, n := range []string{q, inboxtype.DeadLetterQueue(q), inboxtype.ParkedQueue(q)} {
		_, _ = ch.QueueDelete(n, false, false, false)
	}
	for _, t := range []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 10 * time.Minute} {
		_, _ = ch.QueueDelete(inboxtype.RetryQueue(q, t), false, false, false)
	}
}

var orderSeq atomic.Int64

func body(i int64) []byte {
	b, _ := json.Marshal(payment{OrderID: fmt.Sprintf("o-%d-%d", os.Getpid(), i), AmountCents: 100 + i%1000, Currency: "EUR"})
	return b
}

// publish sends n persistent messages with publisher confirms, pipelined.
func (e *env) publish(ctx context.Context, q string, n int) error {
	ch, err := e.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, n+1))
	for range n {
		i := orderSeq.Add(1)
		err := ch.PublishWithContext(ctx, "", q, false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, ContentType: "application/json",
			MessageId: fmt.Sprintf("m-%d", i), Body: body(i),
			Headers: amqp.Table{"x-bench-ts": time.Now().UnixNano()},
		})
		if err != nil {
			return err
		}
	}
	for range n {
		select {
		case c := <-confirms:
			if !c.Ack {
				return fmt.Errorf("publish %d nacked", c.DeliveryTag)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// trips are one drain's round trips per delivery.
type trips struct {
	pg, redis, brokerIn, brokerOut float64
}

// drain pre-publishes n messages, then times the case draining them.
func drain(ctx context.Context, e *env, c benchCase, n int) (rate, allocsPer, cpuPerUS, machinePerUS float64, rt trips, err error) {
	if err := e.reset(ctx); err != nil {
		return 0, 0, 0, 0, rt, err
	}
	q, err := e.freshQueue(c.queueType)
	if err != nil {
		return 0, 0, 0, 0, rt, err
	}
	defer e.deleteQueue(q)
	if err := e.publish(ctx, q, n); err != nil {
		return 0, 0, 0, 0, rt, err
	}
	inBefore, outBefore, brokerOK := brokerPackets(ctx)
	printSQLCounts("before "+c.id, n) // resets the counts
	pgBefore, redisBefore := pgTrips.Load(), redisTrips.Load()
	runtime.GC()
	var count atomic.Int64
	finished := make(chan struct{})
	var once sync.Once
	before := snapshot()
	stop, err := c.run(ctx, q, func(time.Time) {
		if count.Add(1) == int64(n) {
			once.Do(func() { close(finished) })
		}
	})
	if err != nil {
		return 0, 0, 0, 0, rt, err
	}
	select {
	case <-finished:
	case <-time.After(5 * time.Minute):
		_ = stop()
		return 0, 0, 0, 0, rt, fmt.Errorf("%w after %d of %d", errTimeout, count.Load(), n)
	case <-ctx.Done():
		_ = stop()
		return 0, 0, 0, 0, rt, ctx.Err()
	}
	if c.settle != nil {
		if err := c.settle(ctx, n); err != nil {
			_ = stop()
			return 0, 0, 0, 0, rt, err
		}
	}
	after := snapshot()
	rt.pg = float64(pgTrips.Load()-pgBefore) / float64(n)
	rt.redis = float64(redisTrips.Load()-redisBefore) / float64(n)
	printSQLCounts(c.id, n)
	rt.brokerIn, rt.brokerOut = -1, -1
	if inAfter, outAfter, ok := brokerPackets(ctx); ok && brokerOK {
		rt.brokerIn, rt.brokerOut = float64(inAfter-inBefore)/float64(n), float64(outAfter-outBefore)/float64(n)
	}
	if err := stop(); err != nil {
		log.Printf("(%s) stop: %v", c.id, err)
	}
	if c.id != "a" {
		var rows int
		if err := e.admin.QueryRow(ctx, "SELECT count(*) FROM bench_ledger").Scan(&rows); err != nil {
			return 0, 0, 0, 0, rt, err
		}
		if rows != n {
			return 0, 0, 0, 0, rt, fmt.Errorf("case %s wrote %d ledger rows for %d messages", c.id, rows, n)
		}
	}
	el := after.at.Sub(before.at)
	return float64(n) / el.Seconds(), float64(after.mallocs-before.mallocs) / float64(n), float64((after.cpu - before.cpu).Microseconds()) / float64(n),
		float64((after.machine - before.machine).Microseconds()) / float64(n), rt, nil
}

// latency publishes at a steady rate for dur and records publish-to-commit
// latency of every message.
func latency(ctx context.Context, e *env, c benchCase, rate float64, dur time.Duration) (p50, p99 time.Duration, err error) {
	if err := e.reset(ctx); err != nil {
		return 0, 0, err
	}
	q, err := e.freshQueue(c.queueType)
	if err != nil {
		return 0, 0, err
	}
	defer e.deleteQueue(q)
	var mu sync.Mutex
	var lat []time.Duration
	var got atomic.Int64
	stop, err := c.run(ctx, q, func(at time.Time) {
		d := time.Since(at)
		mu.Lock()
		lat = append(lat, d)
		mu.Unlock()
		got.Add(1)
	})
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = stop() }()
	ch, err := e.conn.Channel()
	if err != nil {
		return 0, 0, err
	}
	defer ch.Close()
	total := int(rate * dur.Seconds())
	interval := time.Duration(float64(time.Second) / max(rate, 1))
	tick := time.NewTicker(max(interval, 50*time.Microsecond))
	defer tick.Stop()
	start := time.Now()
	for i := 0; i < total; i++ {
		// catch up when the ticker is coarser than the interval
		due := start.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			<-tick.C
		}
		j := orderSeq.Add(1)
		now := time.Now() // as package producer stamps it
		if err := ch.PublishWithContext(ctx, "", q, false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, ContentType: "application/json",
			MessageId: fmt.Sprintf("m-%d", j), Body: body(j),
			Headers: amqp.Table{"x-bench-ts": now.UnixNano(), inboxtype.HeaderPublishedAt: now.UnixMicro()},
		}); err != nil {
			return 0, 0, err
		}
	}
	deadline := time.Now().Add(time.Minute)
	for got.Load() < int64(total) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lat) < total {
		return percentile(lat, 0.5), percentile(lat, 0.99), fmt.Errorf("only %d of %d messages completed", len(lat), total)
	}
	return percentile(lat, 0.5), percentile(lat, 0.99), nil
}

func report(w io.Writer, rs []*result, n, runs, latRuns int) {
	byID := map[string]float64{}
	rates := map[string][]float64{}
	fmt.Fprintf(w, "\n%d persistent messages per drain, median of %d; latency: medians of %d runs; GOMAXPROCS=%d; Go %s\n\n", n, runs, latRuns, runtime.GOMAXPROCS(0), runtime.Version())
	fmt.Fprintln(w, "| case | msg/s (median) | runs | allocs/delivery | worker CPU µs/delivery | machine CPU µs/delivery | PG round trips/delivery | Redis round trips/delivery | broker packets in/out per delivery | RSS MiB | p50 | p99 |")
	fmt.Fprintln(w, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rs {
		m := median(r.rates)
		byID[r.c.id] = m
		rates[r.c.id] = r.rates
		var runsS []string
		for _, x := range r.rates {
			runsS = append(runsS, fmtRate(x))
		}
		lat := fmt.Sprintf("%s | %s", r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond))
		if r.p50 == 0 && r.p99 == 0 && r.latencyErr == "" {
			lat = "— | —" // no latency runs (-latency 0)
		}
		if r.latencyErr != "" {
			lat += " (" + r.latencyErr + ")"
		}
		broker := "—"
		if bi, bo := median(r.brokerIn), median(r.brokerOut); bi >= 0 && bo >= 0 && len(r.brokerIn) > 0 {
			broker = fmt.Sprintf("%.2f / %.2f", bi, bo)
		}
		fmt.Fprintf(w, "| (%s) %s | %.0f | %s | %.1f | %.0f | %.0f | %.2f | %.2f | %s | %.0f | %s |\n", r.c.id, r.c.name, m, strings.Join(runsS, " / "), r.allocs, r.cpuUS, median(r.machines),
			median(r.pgRT), median(r.redisRT), broker, r.rss, lat)
	}
	fmt.Fprintln(w)
	ratio := func(a, b, target string) {
		if byID[a] > 0 && byID[b] > 0 {
			fmt.Fprintf(w, "- (%s)/(%s) = %.2f, paired %.2f (%s)\n", a, b, byID[a]/byID[b], pairedRatio(rates[a], rates[b]), target)
		}
	}
	ratio("d", "b", "target ≥ 1.0")
	ratio("e", "c", "target ≥ 0.85")
	ratio("e", "b", "target ≥ 5")
	ratio("eb", "c", "group commit through BatchHandler against 64 per tx by hand")
	ratio("f", "d", "target ≥ 0.75")
	ratio("f", "g", "claim mode against its hand-written protocol")
	ratio("fl", "f", "claim mode with the Redis lock (RouteOpts.Lock) against without: the lock's cost")
	ratio("g", "b", "the claim protocol's own ceiling against one tx per delivery")
	ratio("g", "d", "the claim protocol by hand against (d): the bound on (f)/(d)")
	ratio("h", "e", "claim mode against transactional mode, both group-committed")
	ratio("h", "d", "claim mode group-committed against per-message transactional mode")
	for _, id := range []string{"d", "e", "f", "h"} {
		ratio(id+"q", id, "the same case on a quorum queue against a classic one")
	}
	ratio("p", "d", "the full payment chain against the bare inbox: target ≥ 0.6")
	ratio("p", "pc", "the full chain against its hand-written ceiling: target ≥ 0.9")
	ratio("pg", "d", "the full chain group-committed against the bare inbox: target ≥ 2.5")
	ratio("pg", "p", "group commit on against off, on the full chain: target > 1")
	ratio("pg", "pgc", "the full chain group-committed against its hand-written batched ceiling: target ≥ 0.9")
	ratio("pgx", "pg", "(pg) with the xmin horizon pinned against (pg): target ≥ 0.9")
	for _, line := range horizonNotes.lines() {
		fmt.Fprintln(w, "- "+line)
	}
	if criticalLine != "" {
		fmt.Fprintln(w, "- "+criticalLine)
	}
	var d, g *result
	for _, r := range rs {
		switch r.c.id {
		case "d":
			d = r
		case "e":
			g = r
		}
	}
	if d != nil && g != nil && g.atPerMessageRate > 0 {
		fmt.Fprintf(w, "- (e) at (d)'s 50%% load (%.0f msg/s): p50 %s, p99 %s; p99 added by group commit: %s (target ≤ MaxWait 2ms + 5ms)\n",
			g.atPerMessageRate, g.p50d.Round(10*time.Microsecond), g.p99d.Round(10*time.Microsecond), (g.p99d - d.p99).Round(10*time.Microsecond))
	}
	fmt.Fprintf(w, "- peak RSS of the benchmark process: %.0f MiB\n", peakRSSMiB())
}

// pairedRatio is the median of the per-round ratios a[i]/b[i]: the runs of
// one round are interleaved seconds apart, so a drift of the machine's
// speed moves both sides of a pair alike, where the ratio of the medians
// can compare a fast run of one case with a slow run of the other.
func pairedRatio(a, b []float64) float64 {
	var rs []float64
	for i := range min(len(a), len(b)) {
		if b[i] > 0 {
			rs = append(rs, a[i]/b[i])
		}
	}
	return median(rs)
}
