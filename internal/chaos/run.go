package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/producer"
)

// FaultEvent is one injected fault.
type FaultEvent struct {
	// At is the time since the scenario's fault phase began.
	At time.Duration
	// Kind is one of the Fault constants.
	Kind string
	// Worker is the target worker's index (-1 for faults without one).
	Worker int
	// Detail says what was done ("closed 1 connection", "deleted 12 keys").
	Detail string
	// Recovery is the time from the end of the fault until the target
	// worker was ready again and the run made progress (a new ledger entry,
	// or nothing left to do). Zero when not measured.
	Recovery time.Duration
	// Err is set when the fault could not be injected or the run did not
	// recover.
	Err string
	// Took is how long the injection itself took (a Failover's Inject: a
	// node killed and started again, three brokers restarted in turn).
	Took time.Duration
	// Stall is the longest time without a new order's ledger entry from
	// the start of a Failover until 95 % of the orders had theirs: how long
	// consumption stopped. Zero for the worker faults.
	Stall time.Duration
	// Tail is the time from the ledger entry that completed 95 % of the
	// orders to the last one. The backlog drains at an even pace, so a long
	// tail is orders a Failover interrupted and that waited for something
	// (a claim whose completion failed waits for its lease). Zero for the
	// worker faults.
	Tail time.Duration
	// Pending is how many orders had no ledger entry yet when a Failover
	// began: the work its stall is measured on. Zero for the worker faults.
	Pending int
	// RateBefore and RateAfter are the orders recorded per second in the
	// 5s before a Failover and from its end until 95 % of the orders had
	// their entry. Zero for the worker faults.
	RateBefore, RateAfter float64
}

// ScenarioReport is the outcome of one scenario.
type ScenarioReport struct {
	// Name is the scenario (ScenarioInbox or ScenarioGateway).
	Name string
	// Queue and Schema are the run's queue and schema names.
	Queue, Schema string
	// Orders, Declined and Poison count what was published; Publishes counts
	// every message sent, duplicate copies included.
	Orders, Declined, Poison, Publishes int
	// Faults are the faults injected, in order.
	Faults []FaultEvent
	// Metrics are the workers' counters summed over all processes (by
	// metric-name suffix; duplicates also as "duplicate_detected_total/<source>").
	Metrics map[string]float64
	// SeriesBefore and SeriesAfter are the workers' series (without the Go
	// and process collectors, histogram buckets and the queue and consumer
	// labels) summed over all processes, scraped just before a Failover and
	// once the run drained; nil without a Failover. See MetricChanges.
	SeriesBefore, SeriesAfter map[string]float64
	// Check is the checker's result (nil if the run broke off before it).
	Check *Result
	// Violations are every broken guarantee: the checker's and the
	// lifecycle's (exit codes, missing metrics, a drain that never ended).
	Violations []string
	// Drain is how long the queue took to settle after the faults stopped.
	Drain time.Duration
	// Retries are the retries the workers scheduled in the outbox
	// (published back to the work queue when due), RetriesLate those of
	// them published more than RetryLateBound after their due time, and
	// RetryLateMax the latest.
	Retries, RetriesLate int
	RetryLateMax         time.Duration
	// Elapsed is the scenario's wall time.
	Elapsed time.Duration
	// LogDir holds the workers' logs.
	LogDir string
}

// Report is the outcome of a [Run].
type Report struct {
	// Seed is the seed the run used; pass it again to replay the run.
	Seed uint64
	// Scenarios are in the order run.
	Scenarios []*ScenarioReport
}

// OK reports whether every scenario kept every guarantee.
func (r *Report) OK() bool {
	for _, s := range r.Scenarios {
		if len(s.Violations) > 0 {
			return false
		}
	}
	return true
}

// Run runs the chaos suite: for each scenario, a fresh schema and queue,
// cfg.Workers payment-worker subprocesses, a publisher that sends every
// order 1–3 times plus poison messages, a seeded fault injector, and then
// the checker. It returns an error only when the run could not be carried
// out (a service down, the build failing); broken guarantees are in the
// report.
func Run(ctx context.Context, cfg *Config) (*Report, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	fmt.Fprintf(c.Log, "chaos: seed %d (replay with -seed %d)\n", c.Seed, c.Seed)
	rep := &Report{Seed: c.Seed}
	workDir := c.WorkDir
	if workDir == "" {
		d, err := os.MkdirTemp("", "inboxchaos-")
		if err != nil {
			return nil, fmt.Errorf("chaos: %w", err)
		}
		workDir = d
		defer func() {
			if rep.OK() && !c.Keep {
				_ = os.RemoveAll(d)
			}
		}()
	}
	if c.Binary == "" {
		root := c.RepoRoot
		if root == "" {
			r, err := RepoRoot()
			if err != nil {
				return nil, err
			}
			root = r
		}
		fmt.Fprintln(c.Log, "chaos: building payment-worker")
		bin, err := BuildWorker(ctx, root, workDir)
		if err != nil {
			return nil, err
		}
		c.Binary = bin
	}
	var redisSrv *redisServer
	if c.RestartRedis {
		srv, err := startRedisServer(ctx, filepath.Join(workDir, "redis"))
		if err != nil {
			return nil, err
		}
		defer srv.stop()
		fmt.Fprintf(c.Log, "chaos: a Redis server of the run's own on port %d (the redis-restart fault restarts it)\n", srv.port)
		redisSrv, c.RedisURL, c.WorkerRedisURL = srv, srv.URL(), srv.URL()
	}
	var pgSrv *pgServer
	if c.RestartPostgres {
		srv, err := startPGServer(ctx)
		if err != nil {
			return nil, err
		}
		defer srv.remove()
		fmt.Fprintf(c.Log, "chaos: a PostgreSQL server of the run's own on port %d (the pg-restart fault restarts it)\n", srv.Port)
		pgSrv, c.DatabaseURL, c.WorkerDatabaseURL = srv, srv.URL(), srv.URL()
	}
	rnd := mrand.New(mrand.NewPCG(c.Seed, 0xc4a05))
	for _, name := range c.Scenarios {
		s, err := runScenario(ctx, &c, name, rnd, workDir, redisSrv, pgSrv)
		if s != nil {
			rep.Scenarios = append(rep.Scenarios, s)
		}
		if err != nil {
			return rep, err
		}
	}
	return rep, nil
}

type scenarioRun struct {
	cfg     *Config
	rnd     *mrand.Rand
	rep     *ScenarioReport
	runID   string
	queue   string
	schema  string
	dbURL   string
	pool    *pgxpool.Pool
	rdb     redis.UniversalClient
	redis   *redisServer // the run's own Redis server (Config.RestartRedis), or nil
	pg      *pgServer    // the run's own PostgreSQL server (Config.RestartPostgres), or nil
	gw      *Gateway
	workers []*worker
	start   time.Time
	// faultStart and faultEnd bound a Failover's Inject.
	faultStart, faultEnd time.Time

	connMu sync.Mutex
	conn   *amqp.Connection // the runner's, on any node: see channel

	mu         sync.Mutex
	violations []string
}

func (r *scenarioRun) violate(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.violations = append(r.violations, fmt.Sprintf(format, args...))
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// withParams adds query parameters to a database URL.
func withParams(u string, params ...string) string {
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	return u + sep + strings.Join(params, "&")
}

func runScenario(ctx context.Context, cfg *Config, name string, rnd *mrand.Rand, workDir string, redisSrv *redisServer, pgSrv *pgServer) (*ScenarioReport, error) {
	began := time.Now()
	id := randomHex(4)
	r := &scenarioRun{
		cfg:    cfg,
		rnd:    rnd,
		redis:  redisSrv,
		pg:     pgSrv,
		runID:  id,
		queue:  "chaos." + id + "." + name,
		schema: "chaos_" + id + "_" + name,
	}
	r.rep = &ScenarioReport{Name: name, Queue: r.queue, Schema: r.schema, LogDir: filepath.Join(workDir, name+"-"+id)}
	r.dbURL = withParams(cfg.DatabaseURL, "search_path="+r.schema)
	fmt.Fprintf(cfg.Log, "chaos: scenario %s: queue %s, schema %s, logs %s\n", name, r.queue, r.schema, r.rep.LogDir)
	if err := os.MkdirAll(r.rep.LogDir, 0o755); err != nil {
		return r.rep, fmt.Errorf("chaos: %w", err)
	}

	if err := r.setup(ctx); err != nil {
		r.teardown()
		return r.rep, err
	}
	defer r.teardown()
	if name == ScenarioGateway {
		r.gw = NewGateway(rnd.Uint64())
		r.gw.SetPhase(GatewayPhase{Delay: cfg.GatewayDelay}, 0)
		defer r.gw.Close()
	}
	exp, msgs := r.messages()
	r.rep.Orders, r.rep.Declined, r.rep.Poison, r.rep.Publishes = len(exp.Orders), len(exp.Declined), len(exp.Poison), len(msgs)

	// Whatever happens (an Inject that ends the calling goroutine
	// included), no worker process outlives the scenario.
	defer r.killWorkers()
	if err := r.startWorkers(ctx); err != nil {
		r.stopWorkers()
		return r.rep, err
	}

	// Fault phase: publish over the first 80 % (with a Failover: at once,
	// a backlog), inject throughout, scrape.
	r.start = time.Now()
	phaseCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	pubErr := make(chan error, 1)
	span := cfg.Duration * 8 / 10
	if cfg.Failover != nil {
		span = 0
	}
	wg.Go(func() { pubErr <- r.publish(phaseCtx, msgs, span) })
	wg.Go(func() { r.scrapeLoop(phaseCtx) })
	var phaseErr error
	if cfg.Failover != nil {
		phaseErr = r.failover(phaseCtx, exp, pubErr)
	} else {
		r.injectLoop(phaseCtx)
		phaseErr = <-pubErr
	}
	if phaseErr != nil {
		cancel()
		wg.Wait()
		r.stopWorkers()
		return r.rep, phaseErr
	}

	// Heal, then wait for the drain.
	r.heal(ctx)
	drainStart := time.Now()
	drained := r.waitDrain(ctx, exp)
	r.rep.Drain = time.Since(drainStart)
	if !drained {
		r.violate("not drained: the run had not settled %s after the faults stopped", cfg.DrainTimeout)
	}
	r.measureRetries(ctx)
	cancel()
	wg.Wait()
	r.scrapeAll(ctx)
	if cfg.Failover != nil {
		r.rep.SeriesAfter = r.seriesSum()
		r.measureStall(ctx)
	}
	r.stopWorkers()
	r.rep.Metrics = make(map[string]float64)
	for _, w := range r.workers {
		for k, v := range w.scrape.totals() {
			r.rep.Metrics[k] += v
		}
	}

	obs := Observed{Gateway: r.gw != nil, Leftover: r.leftovers()}
	if r.gw != nil {
		obs.Calls = r.gw.Calls()
	}
	dls, err := r.drainDLQ()
	if err != nil {
		return r.rep, err
	}
	obs.DeadLetters = dls
	res, err := Check(ctx, r.pool, exp, obs)
	if err != nil {
		return r.rep, err
	}
	r.rep.Check = res
	r.mu.Lock()
	r.rep.Violations = append(slices.Clone(res.Violations), r.violations...)
	r.mu.Unlock()
	r.rep.Elapsed = time.Since(began)
	fmt.Fprintf(cfg.Log, "chaos: scenario %s done in %s: %d violations\n", name, r.rep.Elapsed.Round(time.Second), len(r.rep.Violations))
	return r.rep, nil
}

func (r *scenarioRun) setup(ctx context.Context) error {
	admin, err := pgx.Connect(ctx, r.cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("chaos: PostgreSQL: %w", err)
	}
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{r.schema}.Sanitize())
	_ = admin.Close(ctx)
	if err != nil {
		return fmt.Errorf("chaos: create schema: %w", err)
	}
	pcfg, err := pgxpool.ParseConfig(withParams(r.dbURL, "application_name=inboxchaos"))
	if err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	pcfg.MaxConns = 4
	if err := inbox.ConfigurePool(pcfg); err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	if r.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return fmt.Errorf("chaos: PostgreSQL: %w", err)
	}
	if r.rdb, err = inboxmq.RedisFromURL(r.cfg.RedisURL, nil); err != nil {
		return fmt.Errorf("chaos: REDIS_URL: %w", err)
	}
	ch, err := r.channel()
	if err != nil {
		return err
	}
	_ = ch.Close()
	// The worker's own migrate command, as operators run it (twice: it
	// must be safe to repeat).
	for range 2 {
		cmd := exec.CommandContext(ctx, r.cfg.Binary, "migrate")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+r.dbURL)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("chaos: payment-worker migrate: %w\n%s", err, out)
		}
	}
	return nil
}

func (r *scenarioRun) teardown() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if r.rdb != nil {
		_, _ = FlushRedisKeys(ctx, r.rdb, r.runID)
		_ = r.rdb.Close()
	}
	if r.pool != nil {
		r.pool.Close()
	}
	if !r.cfg.Keep {
		// At once: deleting a quorum queue with a member node down waits
		// for that node's timeout, queue by queue.
		var wg sync.WaitGroup
		for _, q := range r.queueNames(true) {
			if ch, err := r.channel(); err == nil {
				wg.Go(func() {
					_, _ = ch.QueueDelete(q, false, false, false)
					_ = ch.Close()
				})
			}
		}
		wg.Wait()
	}
	r.connMu.Lock()
	if r.conn != nil {
		_ = r.conn.Close()
	}
	r.connMu.Unlock()
	if r.cfg.Keep {
		return
	}
	if admin, err := pgx.Connect(ctx, r.cfg.DatabaseURL); err == nil {
		_, _ = admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{r.schema}.Sanitize()+" CASCADE")
		_ = admin.Close(ctx)
	}
}

// queueNames returns the work queue and its retry queues (and the DLQ).
func (r *scenarioRun) queueNames(withDLQ bool) []string {
	out := []string{r.queue}
	// The payment-worker uses the consumer's default delay tiers; their
	// wait queues must be empty at the end of a run.
	for _, t := range consumer.DefaultRetryTiers {
		out = append(out, inboxtype.RetryQueue(r.queue, t))
	}
	if withDLQ {
		out = append(out, inboxtype.DeadLetterQueue(r.queue))
	}
	return out
}

type payment struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// messages builds the scenario's orders (1–3 copies each), declined orders
// (gateway scenario) and poison messages, shuffled.
func (r *scenarioRun) messages() (Expect, []producer.Message) {
	var exp Expect
	var msgs []producer.Message
	currencies := []string{"EUR", "USD", "GBP", "chf"}
	add := func(body []byte, copies int) {
		for range copies {
			msgs = append(msgs, producer.Message{RoutingKey: r.queue, ContentType: "application/json", Body: body})
		}
	}
	for i := range r.cfg.Orders {
		o := Order{
			ID:          fmt.Sprintf("%s-%s-%05d", r.runID, r.rep.Name, i),
			AmountCents: 1 + r.rnd.Int64N(100_000),
			Currency:    currencies[r.rnd.IntN(len(currencies))],
			Copies:      1 + r.rnd.IntN(3),
		}
		exp.Orders = append(exp.Orders, o)
		body, _ := json.Marshal(payment{o.ID, o.AmountCents, o.Currency})
		add(body, o.Copies)
	}
	if r.rep.Name == ScenarioGateway {
		for i := range max(2, r.cfg.Orders/50) {
			o := Order{ID: fmt.Sprintf("%s-%s-%05d-declined", r.runID, r.rep.Name, i), AmountCents: 999, Currency: "EUR", Copies: 1}
			exp.Declined = append(exp.Declined, o)
			body, _ := json.Marshal(payment{o.ID, o.AmountCents, o.Currency})
			add(body, 1)
		}
	}
	poison := []string{
		`{not json ` + r.runID + ` %d`,
		`{"amount_cents": 500, "currency": "EUR", "note": "no order_id %d ` + r.runID + `"}`,
		`{"order_id": "` + r.runID + `-zero-%d", "amount_cents": 0, "currency": "EUR"}`,
		`{"order_id": "` + r.runID + `-currency-%d", "amount_cents": 500, "currency": "EURO"}`,
		`{"order_id": "` + r.runID + `-negative-%d", "amount_cents": -5, "currency": "EUR"}`,
		`["an array", %d, "` + r.runID + `"]`,
		`{"order_id": "", "amount_cents": 7, "currency": "EUR", "n": %d, "r": "` + r.runID + `"}`,
	}
	for i := range max(len(poison), r.cfg.Orders/40) {
		b := []byte(fmt.Sprintf(poison[i%len(poison)], i))
		exp.Poison = append(exp.Poison, b)
		add(b, 1)
	}
	if r.cfg.Failover != nil {
		// A backlog whose copies of one order sit side by side: they are
		// delivered together and race for the lock and the claim.
		groups := groupCopies(msgs)
		r.rnd.Shuffle(len(groups), func(i, j int) { groups[i], groups[j] = groups[j], groups[i] })
		msgs = slices.Concat(groups...)
	} else {
		r.rnd.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	}
	for i := range msgs {
		msgs[i].ID = r.runID + "-m" + randomHex(6) // duplicates carry different ids
	}
	return exp, msgs
}

// groupCopies splits msgs into runs of equal bodies (an order's copies).
func groupCopies(msgs []producer.Message) [][]producer.Message {
	var out [][]producer.Message
	for i := 0; i < len(msgs); {
		j := i + 1
		for j < len(msgs) && string(msgs[j].Body) == string(msgs[i].Body) {
			j++
		}
		out = append(out, msgs[i:j])
		i = j
	}
	return out
}

// publish sends msgs spread over span with package producer (confirmed,
// mandatory, retried across a lost connection), one at a time. The bodies
// are sent as they are (poison included), so Producer.Send, not Publish.
// A zero span publishes them at once (publishBacklog).
func (r *scenarioRun) publish(ctx context.Context, msgs []producer.Message, span time.Duration) error {
	p, err := producer.New(&producer.Config{URL: r.cfg.AMQPURL, ConnectionName: "inboxmq-chaos publisher " + r.runID})
	if err != nil {
		return fmt.Errorf("chaos: publisher: %w", err)
	}
	defer p.Close()
	if span == 0 {
		return r.publishBacklog(ctx, p, msgs)
	}
	gap := span / time.Duration(max(len(msgs), 1))
	start := time.Now()
	for i := range msgs {
		if wait := time.Until(start.Add(time.Duration(i) * gap)); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		// Publishing is not a fault target: use a fresh context so that the
		// end of the fault phase never cuts the publisher off mid-run.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		err := p.Send(pctx, &msgs[i])
		cancel()
		if err != nil {
			return fmt.Errorf("chaos: publish message %d: %w", i, err)
		}
	}
	fmt.Fprintf(r.cfg.Log, "chaos: published %d messages in %s\n", len(msgs), time.Since(start).Round(time.Millisecond))
	return nil
}

// backlogSenders is how many sends publishBacklog keeps in flight.
const backlogSenders = 32

// publishBacklog publishes msgs at once with p, backlogSenders at a time
// (each waits for its confirm), roughly in order: an order's adjacent
// copies still reach the queue together.
func (r *scenarioRun) publishBacklog(ctx context.Context, p *producer.Producer, msgs []producer.Message) error {
	start := time.Now()
	// Publishing is not a fault target: the end of the fault phase never
	// cuts it off.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancel()
	next := make(chan int)
	errs := make(chan error, backlogSenders)
	var wg sync.WaitGroup
	for range backlogSenders {
		wg.Go(func() {
			for i := range next {
				if err := p.Send(pctx, &msgs[i]); err != nil {
					errs <- fmt.Errorf("chaos: publish message %d: %w", i, err)
					cancel()
					return
				}
			}
		})
	}
feed:
	for i := range msgs {
		select {
		case next <- i:
		case <-pctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
	}
	if err := pctx.Err(); err != nil {
		return fmt.Errorf("chaos: publish the backlog: %w", err)
	}
	fmt.Fprintf(r.cfg.Log, "chaos: published a backlog of %d messages in %s\n", len(msgs), time.Since(start).Round(time.Millisecond))
	return nil
}

func (r *scenarioRun) startWorkers(ctx context.Context) error {
	for i := range r.cfg.Workers {
		addr, err := freePort()
		if err != nil {
			return err
		}
		app := fmt.Sprintf("inboxchaos_%s_w%d", r.runID, i)
		env := []string{
			"AMQP_URL=" + r.cfg.WorkerAMQPURL,
			"DATABASE_URL=" + withParams(r.cfg.WorkerDatabaseURL, "search_path="+r.schema, "application_name="+app),
			"REDIS_URL=" + r.cfg.WorkerRedisURL,
			"PAYMENT_QUEUE=" + r.queue,
			"LOCK_TTL=" + r.cfg.LockTTL.String(),
			fmt.Sprintf("WORKER_CONCURRENCY=%d", r.cfg.Concurrency),
			"METRICS_ADDR=" + addr,
		}
		if r.gw != nil {
			env = append(env, "GATEWAY_URL="+r.gw.URL())
		}
		if r.cfg.GroupCommit {
			env = append(env, "GROUP_COMMIT=on")
		}
		if r.cfg.QueueType != "" {
			env = append(env, "QUEUE_TYPE="+r.cfg.QueueType)
		}
		if r.cfg.Lock != "" {
			env = append(env, "LOCK="+r.cfg.Lock)
		}
		env = append(env, r.cfg.WorkerEnv...)
		w := &worker{
			idx: i, bin: r.cfg.Binary, env: env, appName: app, metrics: addr,
			logPath: filepath.Join(r.rep.LogDir, fmt.Sprintf("worker-%d.log", i)), scrape: newScraper(addr),
		}
		r.workers = append(r.workers, w)
		if err := w.start(); err != nil {
			return err
		}
	}
	for _, w := range r.workers {
		if _, err := w.waitReady(ctx, time.Minute); err != nil {
			return err
		}
		if w.scrape.scrape(ctx) {
			if miss := w.scrape.missing(); len(miss) > 0 {
				r.violate("metrics not exported from startup by worker %d: %s", w.idx, strings.Join(miss, ", "))
			}
		} else {
			r.violate("worker %d serves no /metrics on %s", w.idx, w.metrics)
		}
	}
	return nil
}

// stopWorkers SIGTERMs every worker and checks the clean stop: exit 0
// within 30 s.
func (r *scenarioRun) stopWorkers() {
	var wg sync.WaitGroup
	for _, w := range r.workers {
		if w.pid() == 0 {
			continue
		}
		wg.Go(func() {
			if exited, _ := w.wait(0); exited {
				return
			}
			_ = w.signal(syscall.SIGCONT)
			_ = w.signal(syscall.SIGTERM)
			exited, err := w.wait(30 * time.Second)
			switch {
			case !exited:
				r.violate("unclean stop: worker %d did not exit within 30s of SIGTERM", w.idx)
				w.kill()
			case err != nil:
				r.violate("unclean stop: worker %d exited with %v after SIGTERM (log %s)", w.idx, err, w.logPath)
			}
		})
	}
	wg.Wait()
}

// killWorkers SIGKILLs every worker still running (the last resort when a
// scenario ends early).
func (r *scenarioRun) killWorkers() {
	for _, w := range r.workers {
		if exited, _ := w.wait(0); !exited {
			w.kill()
		}
	}
}

func (r *scenarioRun) scrapeAll(ctx context.Context) {
	for _, w := range r.workers {
		w.mu.Lock()
		stopped := w.stopped
		w.mu.Unlock()
		if !stopped {
			w.scrape.scrape(ctx)
		}
	}
}

func (r *scenarioRun) scrapeLoop(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			r.scrapeAll(ctx)
		}
	}
}

// channel opens a channel on the runner's connection, dialling again
// (consumer.Dial tries a cluster's nodes in turn) when that connection was
// lost.
func (r *scenarioRun) channel() (*amqp.Channel, error) {
	r.connMu.Lock()
	defer r.connMu.Unlock()
	for attempt := 0; ; attempt++ {
		if r.conn == nil || r.conn.IsClosed() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			conn, _, err := consumer.Dial(ctx, r.cfg.AMQPURL, &consumer.DialOpts{Name: "inboxmq-chaos runner " + r.runID, Timeout: 5 * time.Second})
			cancel()
			if err != nil {
				return nil, fmt.Errorf("chaos: RabbitMQ: %w", err)
			}
			r.conn = conn
		}
		ch, err := r.conn.Channel()
		if err == nil {
			return ch, nil
		}
		_ = r.conn.Close()
		if attempt > 0 {
			return nil, fmt.Errorf("chaos: channel: %w", err)
		}
	}
}

// depth returns the ready messages in queue (0 if it does not exist).
func (r *scenarioRun) depth(queue string) (int, error) {
	ch, err := r.channel()
	if err != nil {
		return 0, err
	}
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
			return 0, nil
		}
		return 0, fmt.Errorf("chaos: inspect %s: %w", queue, err)
	}
	_ = ch.Close()
	return q.Messages, nil
}

// retriesPending counts the retries scheduled in the outbox and not yet
// published; -1 if the database does not answer.
func (r *scenarioRun) retriesPending(ctx context.Context) int {
	n := -1
	_ = r.pool.QueryRow(ctx, `SELECT count(*) FROM inboxmq_outbox WHERE sent_at IS NULL AND properties IS NOT NULL`).Scan(&n)
	return n
}

// RetryLateBound is how late a scheduled retry may go out (after its due
// time) before the report counts it as late: the bound after the loss of
// the broker node leading its queue.
const RetryLateBound = 10 * time.Second

// measureRetries reads the retries the workers scheduled in the outbox
// and how late each went out (sent_at − created_at: a scheduled retry's
// created_at is its due time).
func (r *scenarioRun) measureRetries(ctx context.Context) {
	var late float64
	err := r.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE sent_at - created_at > make_interval(secs => $1)),
	coalesce(extract(epoch FROM max(sent_at - created_at)), 0)::float8
FROM inboxmq_outbox WHERE properties IS NOT NULL AND sent_at IS NOT NULL`, RetryLateBound.Seconds()).Scan(&r.rep.Retries, &r.rep.RetriesLate, &late)
	if err != nil {
		r.violate("read the scheduled retries: %v", err)
		return
	}
	r.rep.RetryLateMax = time.Duration(late * float64(time.Second))
}

func (r *scenarioRun) ledgerCount(ctx context.Context) int {
	var n int
	_ = r.pool.QueryRow(ctx, `SELECT count(DISTINCT order_id) FROM ledger_entries`).Scan(&n)
	return n
}

// heal ends every fault: continues stopped workers, restarts dead ones (a
// violation after a Failover, which kills no worker) and makes the gateway
// healthy.
func (r *scenarioRun) heal(ctx context.Context) {
	if r.gw != nil {
		r.gw.SetPhase(GatewayPhase{Delay: r.cfg.GatewayDelay}, 0)
	}
	for _, w := range r.workers {
		_ = w.signal(syscall.SIGCONT)
		if exited, werr := w.wait(0); exited {
			if r.cfg.Failover != nil {
				// Nothing killed it: a worker must ride a failover out.
				r.violate("worker %d exited after %s (%v): a worker must ride a failover out without a restart (log %s)",
					w.idx, r.cfg.Failover.Name, werr, w.logPath)
			}
			w.scrape.restarted()
			if err := w.start(); err != nil {
				r.violate("heal: %v", err)
				continue
			}
			if _, err := w.waitReady(ctx, time.Minute); err != nil {
				r.violate("heal: %v", err)
			}
		}
	}
}

// waitDrain waits until every order has its ledger entry, the DLQ holds
// every poison and declined message, the work and retry queues are empty
// and no worker holds a delivery (idle), in two checks in a row, bounded
// by DrainTimeout.
func (r *scenarioRun) waitDrain(ctx context.Context, exp Expect) bool {
	deadline := time.Now().Add(r.cfg.DrainTimeout)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	settled := 0 // consecutive checks that found the run settled
	for time.Now().Before(deadline) {
		done := r.ledgerCount(ctx) >= len(exp.Orders) && r.retriesPending(ctx) == 0
		if done {
			dlq, err := r.depth(inboxtype.DeadLetterQueue(r.queue))
			done = err == nil && dlq >= len(exp.Poison)+len(exp.Declined)
		}
		for _, q := range r.queueNames(false) {
			if !done {
				break
			}
			n, err := r.depth(q)
			done = err == nil && n == 0
		}
		done = done && r.idle(ctx)
		if !done {
			settled = 0
		} else if settled++; settled == 2 {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
	return false
}

// idle reports whether no running worker holds a delivery (its in_flight
// gauges sum to 0). A queue's depth counts only the messages ready in it:
// one a worker is handling counts nowhere, and if the worker defers it, it
// reappears in a retry queue and, a delay later, in the work queue. A
// worker that cannot be scraped is not idle; one that has exited holds
// nothing (the broker requeued what it had).
func (r *scenarioRun) idle(ctx context.Context) bool {
	for _, w := range r.workers {
		if exited, _ := w.wait(0); exited {
			continue
		}
		if !w.scrape.scrape(ctx) {
			return false
		}
		if w.scrape.currentSeries()["in_flight"] != 0 {
			return false
		}
	}
	return true
}

func (r *scenarioRun) leftovers() map[string]int {
	out := make(map[string]int)
	for _, q := range r.queueNames(false) {
		n, err := r.depth(q)
		if err != nil {
			r.violate("inspect %s: %v", q, err)
			continue
		}
		out[q] = n
	}
	return out
}

func (r *scenarioRun) drainDLQ() ([]DeadLetter, error) {
	ch, err := r.channel()
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	var out []DeadLetter
	for {
		d, ok, err := ch.Get(inboxtype.DeadLetterQueue(r.queue), true)
		if err != nil {
			var aerr *amqp.Error
			if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
				return out, nil
			}
			return out, fmt.Errorf("chaos: read DLQ: %w", err)
		}
		if !ok {
			return out, nil
		}
		reason, _ := d.Headers[inboxtype.HeaderError].(string)
		out = append(out, DeadLetter{Body: d.Body, Error: reason})
	}
}
