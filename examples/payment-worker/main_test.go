package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/producer"
)

// The eight metric names the contract promises from start-up.
var contractMetrics = []string{
	"duplicate_detected_total",
	"lock_acquire_success_total",
	"lock_acquire_failed_total",
	"lock_expired_before_completion_total",
	"job_retry_total",
	"job_processing_duration_seconds",
	"idempotency_conflict_total",
	"stale_processing_records_total",
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	buildDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// workerBinary builds the payment-worker once per test run (a plain `go
// build`, as operators do) and returns its path.
func workerBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "payment-worker-test-")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(buildDir, "payment-worker")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return binPath
}

// testBundle is one test's world: its schema, queue, broker connection and
// the environment the worker processes get.
type testBundle struct {
	pool   *pgxpool.Pool
	queue  string
	events string
	conn   *amqp.Connection
	pub    *amqptest.Publisher // raw bodies, for malformed input
	prod   *producer.Producer  // orders, as a real producer publishes them
	env    []string
	binary string
}

func setup(t testing.TB, extraEnv ...string) *testBundle {
	t.Helper()
	pool, schema := pgtest.Schema(t)
	queue := amqptest.QueueName(t)
	conn := amqptest.Dial(t)
	events := queue + ".events"
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_ = ch.ExchangeDelete(events, false, false)
			_ = ch.Close()
		}
	})
	env := append(os.Environ(),
		"PAYMENT_EVENTS_EXCHANGE="+events,
		"DATABASE_URL="+pgtest.URL(schema),
		"AMQP_URL="+testenv.AMQPURL(),
		"REDIS_URL="+testenv.RedisURL(),
		"PAYMENT_QUEUE="+queue,
		"WORKER_CONCURRENCY=4",
	)
	return &testBundle{
		pool:   pool,
		queue:  queue,
		events: events,
		conn:   conn,
		pub:    amqptest.NewPublisher(t, conn),
		prod:   newProducer(t),
		env:    append(env, extraEnv...),
		binary: workerBinary(t),
	}
}

// worker is one running `payment-worker run` process.
type worker struct {
	cmd        *exec.Cmd
	metricsURL string
	stderr     *syncBuffer
	exited     chan error
}

// start runs `payment-worker run` with its own metrics port and waits until
// /readyz answers 200 (its topology is declared and it consumes).
func (b *testBundle) start(t testing.TB) *worker {
	t.Helper()
	addr := freeAddr(t)
	w := &worker{metricsURL: "http://" + addr, stderr: &syncBuffer{}, exited: make(chan error, 1)}
	w.cmd = exec.Command(b.binary, "run")
	w.cmd.Env = append(append([]string{}, b.env...), "METRICS_ADDR="+addr)
	w.cmd.Stderr = w.stderr
	require.NoError(t, w.cmd.Start())
	go func() { w.exited <- w.cmd.Wait() }()
	t.Cleanup(func() {
		_ = w.cmd.Process.Kill()
		<-w.exited
		if t.Failed() || os.Getenv("PAYMENT_WORKER_TEST_LOG") != "" {
			t.Logf("worker log:\n%s", tail(w.stderr.String(), 4000))
		}
	})
	testenv.WaitFor(t, "worker /readyz answers 200", func() bool {
		select {
		case err := <-w.exited:
			w.exited <- err
			t.Fatalf("worker exited before it was ready: %v\n%s", err, tail(w.stderr.String(), 40))
		default:
		}
		code, _ := httpGet(w.metricsURL + "/readyz")
		return code == http.StatusOK
	})
	return w
}

// stop sends SIGTERM and requires exit status 0 within 30 s.
func (w *worker) stop(t testing.TB) {
	t.Helper()
	require.NoError(t, w.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-w.exited:
		w.exited <- err
		require.NoError(t, err, "worker exit status after SIGTERM")
	case <-time.After(30 * time.Second):
		t.Fatal("worker did not exit within 30s of SIGTERM")
	}
}

func (w *worker) metrics(t testing.TB) string {
	t.Helper()
	code, body := httpGet(w.metricsURL + "/metrics")
	require.Equal(t, http.StatusOK, code)
	return body
}

// metricSum sums the samples of the worker's counters and gauges whose
// name ends in suffix.
func (w *worker) metricSum(t testing.TB, suffix string) float64 {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(w.metrics(t)))
	require.NoError(t, err)
	var sum float64
	for name, f := range families {
		if strings.HasSuffix(name, suffix) {
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// newID returns a fresh message id.
func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// subscribe binds a private queue to the worker's events exchange (which
// the worker has declared) and returns its deliveries.
func (b *testBundle) subscribe(t testing.TB) <-chan amqp.Delivery {
	t.Helper()
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(q.Name, "payment.completed", b.events, false, nil))
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	require.NoError(t, err)
	return deliveries
}

func (b *testBundle) migrate(t testing.TB) {
	t.Helper()
	cmd := exec.Command(b.binary, "migrate")
	cmd.Env = b.env
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "migrate: %s", out)
}

// publishOrders publishes n orders named prefix-i, order i (1 + i%copies)
// times, each copy under a new message id. It returns the number of copies.
func (b *testBundle) publishOrders(t testing.TB, prefix string, n, copies int) int {
	t.Helper()
	total := 0
	for i := range n {
		p := Payment{OrderID: fmt.Sprintf("%s-%03d", prefix, i), AmountCents: int64(100 + i), Currency: "EUR"}
		for range 1 + i%copies {
			// Each copy under an id of its own: the inbox deduplicates by
			// the key, never by the message id.
			require.NoError(t, producer.Publish(t.Context(), b.prod, "", b.queue, p, &producer.PublishOpts{MessageID: newID()}))
			total++
		}
	}
	return total
}

// newProducer returns a producer on the test broker, closed when the test
// ends.
func newProducer(t testing.TB) *producer.Producer {
	t.Helper()
	p, err := producer.New(&producer.Config{URL: testenv.AMQPURL(), ConnectionName: "payment-worker test " + t.Name()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func (b *testBundle) count(t testing.TB, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(t.Context(), query, args...).Scan(&n))
	return n
}

// requireOneEffectPerOrder checks exactly one payment and one ledger entry
// for each of the n orders named prefix-i, and nothing else under prefix.
func (b *testBundle) requireOneEffectPerOrder(t testing.TB, prefix string, n int) {
	t.Helper()
	like := prefix + "-%"
	require.Equal(t, n, b.count(t, `SELECT count(*) FROM payments WHERE order_id LIKE $1`, like), "payments rows")
	require.Equal(t, n, b.count(t, `SELECT count(DISTINCT order_id) FROM payments WHERE order_id LIKE $1`, like), "distinct paid orders")
	require.Equal(t, n, b.count(t, `SELECT count(*) FROM ledger_entries WHERE order_id LIKE $1`, like), "ledger rows")
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM (SELECT order_id FROM ledger_entries WHERE order_id LIKE $1 GROUP BY order_id HAVING count(*) > 1) d`, like), "orders with more than one ledger entry")
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM payments p WHERE order_id LIKE $1 AND NOT EXISTS (SELECT 1 FROM ledger_entries l WHERE l.order_id = p.order_id)`, like), "payments without a ledger entry")
}

func TestWorkerEndToEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)

	b.migrate(t)
	b.migrate(t) // safe to run twice
	w := b.start(t)
	events := b.subscribe(t)

	// Every contract metric is exported before the first delivery.
	m := w.metrics(t)
	for _, name := range contractMetrics {
		require.Regexp(t, regexp.MustCompile(`(?m)^# TYPE \S*`+name+` `), m, "metric %s from start-up", name)
	}

	const orders = 60
	copies := b.publishOrders(t, "e2e", orders, 3)
	invalid := [][]byte{
		[]byte(`{not json`),
		[]byte(`{"amount_cents": 500, "currency": "EUR"}`),
		[]byte(`{"order_id": "e2e-bad-amount", "amount_cents": 0, "currency": "EUR"}`),
		[]byte(`{"order_id": "e2e-bad-currency", "amount_cents": 500, "currency": "EURO"}`),
	}
	for _, body := range invalid {
		b.pub.Publish(b.queue, body, amqp.Publishing{MessageId: newID()})
	}

	testenv.WaitFor(t, "every copy is processed", func() bool {
		return b.count(t, `SELECT count(*) FROM payments WHERE order_id LIKE 'e2e-%'`) >= orders &&
			amqptest.Depth(t, b.conn, b.queue+".dlq") >= len(invalid) &&
			int(w.metricSum(t, "duplicate_detected_total")) >= copies-orders
	})
	b.requireOneEffectPerOrder(t, "e2e", orders)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM payments WHERE order_id LIKE 'e2e-bad%'`))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM ledger_entries WHERE order_id LIKE 'e2e-bad%'`))
	require.InDelta(t, float64(copies-orders), w.metricSum(t, "duplicate_detected_total"), 0)

	// The invalid messages are in the DLQ with their reason, and the
	// originals were acked: the work queue is empty.
	dead := amqptest.Drain(t, b.conn, b.queue+".dlq")
	require.Len(t, dead, len(invalid))
	for _, d := range dead {
		reason, ok := d.Headers[inboxtype.HeaderError].(string)
		require.True(t, ok, "dead letter %s has an x-error header", d.Body)
		require.NotEmpty(t, reason)
	}
	require.Equal(t, 0, amqptest.Depth(t, b.conn, b.queue))

	// One payment.completed event per order went out through the outbox
	// (a relay crash could repeat one, always under the same message id).
	seen := map[string]bool{}
	testenv.WaitFor(t, "one payment.completed event per order", func() bool {
		for {
			select {
			case d, ok := <-events:
				require.True(t, ok, "the events subscription is open")
				var ev Payment
				require.NoError(t, json.Unmarshal(d.Body, &ev))
				require.True(t, strings.HasPrefix(ev.OrderID, "e2e-"), "event for %s", ev.OrderID)
				require.Equal(t, "payment:"+ev.OrderID, d.Headers[inboxtype.HeaderIdempotencyKey])
				seen[d.MessageId] = true
			default:
				return len(seen) == orders
			}
		}
	})

	w.stop(t)
	requireTransitionLogs(t, w.stderr.String(), "payment:e2e-000")
}

// requireTransitionLogs checks the JSON log lines of one key: each carries
// the message id, attempt, worker id and status, and the key went from
// received to completed.
func requireTransitionLogs(t *testing.T, logs, key string) {
	t.Helper()
	statuses := map[inboxtype.Status]bool{}
	for line := range strings.Lines(logs) {
		var entry map[string]any
		if json.Unmarshal([]byte(line), &entry) != nil || entry["idempotency_key"] != key {
			continue
		}
		for _, field := range []string{"message_id", "attempt", "worker_id", "status"} {
			require.Contains(t, entry, field, "log line %s", line)
		}
		status, _ := entry["status"].(string)
		statuses[inboxtype.Status(status)] = true
	}
	require.True(t, statuses[inboxtype.StatusCompleted], "a completed transition is logged for %s: %v", key, statuses)
	require.True(t, statuses[inboxtype.StatusProcessing], "a processing transition is logged for %s: %v", key, statuses)
}

func TestTwoWorkersOneEffectPerOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.migrate(t)
	w1 := b.start(t)
	w2 := b.start(t)

	const orders = 60
	copies := b.publishOrders(t, "two", orders, 3)
	testenv.WaitFor(t, "every copy is processed by one of the two workers", func() bool {
		return b.count(t, `SELECT count(*) FROM payments WHERE order_id LIKE 'two-%'`) >= orders &&
			amqptest.Depth(t, b.conn, b.queue) == 0 &&
			int(w1.metricSum(t, "duplicate_detected_total")+w2.metricSum(t, "duplicate_detected_total")) >= copies-orders
	})
	b.requireOneEffectPerOrder(t, "two", orders)
	w1.stop(t)
	w2.stop(t)
}

func TestWorkerKilledMidBurstRestartsWithoutDuplicates(t *testing.T) {
	t.Parallel()
	// The killed worker's Redis locks stay until their TTL: a short one
	// keeps the test quick (the keys are retried, never lost, meanwhile).
	b := setup(t, "LOCK_TTL=2s")
	b.migrate(t)
	w1 := b.start(t)

	const orders = 150
	b.publishOrders(t, "kill", orders, 2)
	testenv.WaitFor(t, "the first worker has committed some payments", func() bool {
		return b.count(t, `SELECT count(*) FROM payments WHERE order_id LIKE 'kill-%'`) >= 10
	})
	// SIGKILL: no graceful stop. Deliveries committed but not yet acked,
	// and transactions still open, are redelivered to the next worker.
	require.NoError(t, w1.cmd.Process.Kill())
	<-w1.exited
	w1.exited <- nil

	w2 := b.start(t)
	testenv.WaitFor(t, "the second worker finishes the burst", func() bool {
		return b.count(t, `SELECT count(*) FROM payments WHERE order_id LIKE 'kill-%'`) >= orders &&
			amqptest.Depth(t, b.conn, b.queue) == 0
	})
	b.requireOneEffectPerOrder(t, "kill", orders)

	// A replay of a completed order, under a new message id, is a duplicate.
	before := w2.metricSum(t, "duplicate_detected_total")
	b.publishOrders(t, "kill", 1, 1)
	testenv.WaitFor(t, "the replay is detected as a duplicate", func() bool {
		return w2.metricSum(t, "duplicate_detected_total") > before
	})
	b.requireOneEffectPerOrder(t, "kill", orders)
	w2.stop(t)
}

func TestWorkerWithoutRedis(t *testing.T) {
	t.Parallel()
	// Nothing listens on the discard port: Redis is "down" for the whole run.
	b := setup(t, "REDIS_URL=redis://127.0.0.1:9/0")
	b.migrate(t)
	w := b.start(t)

	const orders = 20
	copies := b.publishOrders(t, "noredis", orders, 2)
	testenv.WaitFor(t, "every copy is processed on PostgreSQL alone", func() bool {
		return b.count(t, `SELECT count(*) FROM payments WHERE order_id LIKE 'noredis-%'`) >= orders &&
			int(w.metricSum(t, "duplicate_detected_total")) >= copies-orders
	})
	b.requireOneEffectPerOrder(t, "noredis", orders)
	w.stop(t)
}

func TestCredentialsNeverLogged(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.Schema(t)
	// PostgreSQL trusts loopback, so the password is accepted and the run
	// gets as far as the broker, where nothing listens on port 1.
	dbURL := strings.Replace(pgtest.URL(schema), "postgres@", "postgres:pg-secret-1@", 1)
	require.Contains(t, dbURL, "pg-secret-1")
	env := append(os.Environ(),
		"DATABASE_URL="+dbURL,
		"AMQP_URL=amqp://guest:amqp-secret-2@127.0.0.1:1/",
		"REDIS_URL=redis://:redis-secret-3@127.0.0.1:9/0",
		"PAYMENT_QUEUE="+amqptest.QueueName(t),
		"METRICS_ADDR="+freeAddr(t),
	)
	bin := workerBinary(t)
	for _, args := range [][]string{{"migrate"}, {"run"}} {
		cmd := exec.CommandContext(t.Context(), bin, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if args[0] == "run" {
			require.Error(t, err, "run fails without a broker: %s", out)
		}
		for _, secret := range []string{"pg-secret-1", "amqp-secret-2", "redis-secret-3"} {
			require.NotContains(t, string(out), secret, "%v output: %s", args, out)
		}
	}
}

// gateway is a fake payment gateway that records every charge call.
type gateway struct {
	mu    sync.Mutex
	calls map[string][]string // order id -> Idempotency-Key of each call
	paid  map[string]int      // order id -> successful charges
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req Payment
	if r.Method != http.MethodPost || r.URL.Path != "/charges" || json.NewDecoder(r.Body).Decode(&req) != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls[req.OrderID] = append(g.calls[req.OrderID], r.Header.Get("Idempotency-Key"))
	switch {
	case strings.HasPrefix(req.OrderID, "down-"):
		http.Error(w, "upstream unavailable", http.StatusServiceUnavailable)
	case strings.HasPrefix(req.OrderID, "reject-"):
		http.Error(w, "card declined", http.StatusUnprocessableEntity)
	case strings.HasPrefix(req.OrderID, "flaky-") && len(g.calls[req.OrderID]) == 1:
		http.Error(w, "upstream unavailable", http.StatusServiceUnavailable)
	default:
		g.paid[req.OrderID]++
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"id":"ch_%s_%d","status":"charged"}`, req.OrderID, g.paid[req.OrderID])
	}
}

func (g *gateway) snapshot() (map[string][]string, map[string]int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	calls := make(map[string][]string, len(g.calls))
	for k, v := range g.calls {
		calls[k] = append([]string(nil), v...)
	}
	paid := make(map[string]int, len(g.paid))
	for k, v := range g.paid {
		paid[k] = v
	}
	return calls, paid
}

func TestWorkerGatewayClaimMode(t *testing.T) {
	t.Parallel()
	gw := &gateway{calls: map[string][]string{}, paid: map[string]int{}}
	srv := newLoopbackServer(t, gw)
	b := setup(t, "GATEWAY_URL="+srv)
	b.migrate(t)
	w := b.start(t)

	const orders = 20
	copies := b.publishOrders(t, "ok", orders, 3)
	b.publishOrders(t, "flaky", 3, 1)
	b.publishOrders(t, "reject", 2, 1)

	testenv.WaitFor(t, "charges done, 5xx retried, 4xx dead-lettered", func() bool {
		return b.count(t, `SELECT count(*) FROM payments`) >= orders+3 &&
			amqptest.Depth(t, b.conn, b.queue+".dlq") >= 2 &&
			int(w.metricSum(t, "duplicate_detected_total")) >= copies-orders
	})
	b.requireOneEffectPerOrder(t, "ok", orders)
	b.requireOneEffectPerOrder(t, "flaky", 3)
	b.requireOneEffectPerOrder(t, "reject", 0)

	calls, paid := gw.snapshot()
	for i := range orders {
		id := fmt.Sprintf("ok-%03d", i)
		require.Equal(t, 1, paid[id], "one charge for %s", id)
		require.Equal(t, []string{"payment:" + id}, calls[id], "one call for %s, with its idempotency key", id)
	}
	for i := range 3 {
		id := fmt.Sprintf("flaky-%03d", i)
		require.Equal(t, 1, paid[id], "one successful charge for %s", id)
		require.Len(t, calls[id], 2, "%s: a 503, then a retry", id)
		for _, k := range calls[id] {
			require.Equal(t, "payment:"+id, k, "every retry carries the same key")
		}
	}
	dead := amqptest.Drain(t, b.conn, b.queue+".dlq")
	require.Len(t, dead, 2)
	for _, d := range dead {
		require.Contains(t, d.Headers[inboxtype.HeaderError], "gateway_4xx")
	}
	require.Positive(t, w.metricSum(t, "job_retry_total"), "the 503s were counted as retries")
	w.stop(t)
}

// newLoopbackServer serves h on 127.0.0.1 and returns its base URL.
func newLoopbackServer(t testing.TB, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return "http://" + ln.Addr().String()
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

func httpGet(url string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, ""
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// syncBuffer is a bytes.Buffer safe for a process's writes and our reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

func tail(s string, lines int) string {
	parts := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return strings.Join(parts, "\n")
}

// With AMQP_URL listing a cluster's nodes, the first one down, the worker
// consumes through the live node, says on /metrics and in its log which
// node it is on, never logs the dead node's password, and declares quorum
// queues by default.
func TestWorkerOnAClusterURL(t *testing.T) {
	t.Parallel()
	dead := strings.Replace(amqptest.DeadURL(t), "guest:guest@", "guest:amqp-secret-4@", 1)
	live := testenv.AMQPURL()
	b := setup(t, "AMQP_URL="+dead+","+live)
	b.migrate(t)
	w := b.start(t)
	const orders = 10
	b.publishOrders(t, "cluster", orders, 2)
	testenv.WaitFor(t, "every order paid", func() bool {
		return b.count(t, `SELECT count(*) FROM payments WHERE order_id LIKE 'cluster-%'`) == orders &&
			amqptest.Depth(t, b.conn, b.queue) == 0
	})
	b.requireOneEffectPerOrder(t, "cluster", orders)

	u, err := url.Parse(live)
	require.NoError(t, err)
	d, err := url.Parse(dead)
	require.NoError(t, err)
	m := w.metrics(t)
	require.Contains(t, m, `inboxmq_broker_node_connections{node="`+u.Host+`",role="consumer"} 1`)
	require.Contains(t, m, `inboxmq_broker_node_connections{node="`+d.Host+`",role="consumer"} 0`)
	w.stop(t)
	logs := w.stderr.String()
	require.Contains(t, logs, `"msg":"broker connection opened"`)
	require.Contains(t, logs, `"node":"`+u.Host+`"`)
	require.NotContains(t, logs, "amqp-secret-4")

	ch, err := b.conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	_, err = ch.QueueDeclare(b.queue+".dlq", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	require.NoError(t, err, "QUEUE_TYPE defaults to quorum")
}
