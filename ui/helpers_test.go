package ui_test

import (
	"context"
	"errors"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/logtest"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
	"github.com/inboxmq/inboxmq/ui"
)

// operatorToken is the token of every test console.
const operatorToken = "test-operator-token-0123456789"

type testBundle struct {
	pool  *pgxpool.Pool
	conn  *amqp.Connection
	queue string
	dlq   string
	con   *ui.Console
	srv   *httptest.Server
	logs  *logtest.Recorder
	reg   *prometheus.Registry
	pub   *amqptest.Publisher
}

// setup starts a console on a fresh schema and a fresh queue name.
// declare declares the work queue and its DLQ as plain classic queues
// (tests that run a worker let the worker declare them).
func setup(t *testing.T, declare bool, mutate func(*ui.Config)) *testBundle {
	t.Helper()
	pool, _ := pgtest.Schema(t)
	conn := amqptest.Dial(t)
	queue := amqptest.QueueName(t)
	b := &testBundle{pool: pool, conn: conn, queue: queue, dlq: queue + ".dlq", reg: prometheus.NewRegistry(), pub: amqptest.NewPublisher(t, conn)}
	if declare {
		ch, err := conn.Channel()
		require.NoError(t, err)
		for _, q := range []string{queue, b.dlq} {
			_, err := ch.QueueDeclare(q, true, false, false, false, nil)
			require.NoError(t, err)
		}
		require.NoError(t, ch.Close())
	}
	_, err := pool.Exec(t.Context(), `CREATE TABLE effects (key text NOT NULL)`)
	require.NoError(t, err)
	var logger *slog.Logger
	logger, b.logs = logtest.New(slog.LevelDebug)
	cfg := &ui.Config{
		DB: pool, AMQPURL: testenv.AMQPURL(), Queues: []ui.Queue{{Name: queue}},
		Token: operatorToken, Logger: logger, Registerer: b.reg,
	}
	if mutate != nil {
		mutate(cfg)
	}
	b.con, err = ui.New(cfg)
	require.NoError(t, err)
	b.srv = httptest.NewServer(b.con)
	t.Cleanup(func() {
		b.srv.Close()
		_ = b.con.Close()
	})
	return b
}

func (b *testBundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

func (b *testBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// deadLetter puts a dead letter of b.queue into its DLQ.
func (b *testBundle) deadLetter(t *testing.T, id, key, reason string, body []byte) {
	t.Helper()
	h := amqp.Table{
		inboxtype.HeaderError: reason, inboxtype.HeaderAttempt: int32(5),
		inboxtype.HeaderOriginalQueue: b.queue, inboxtype.HeaderLastFailedAt: "2026-12-03T10:00:00Z",
	}
	if key != "" {
		h[inboxtype.HeaderIdempotencyKey] = key
	}
	b.pub.Publish(b.dlq, body, amqp.Publishing{MessageId: id, Headers: h})
}

// client is a browser stand-in: a cookie jar, no redirects followed.
type client struct {
	t    *testing.T
	base string
	hc   *http.Client
	csrf string
}

func (b *testBundle) client(t *testing.T) *client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &client{t: t, base: b.srv.URL, hc: &http.Client{
		Jar: jar, Timeout: testenv.Timeout(),
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func (c *client) do(req *http.Request) (*http.Response, string) {
	c.t.Helper()
	resp, err := c.hc.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	return resp, string(body)
}

// get fetches path and returns the status and the page.
func (c *client) get(path string) (int, string) {
	c.t.Helper()
	req, err := http.NewRequestWithContext(c.t.Context(), http.MethodGet, c.base+path, nil)
	require.NoError(c.t, err)
	resp, body := c.do(req)
	return resp.StatusCode, body
}

// post submits a form as a same-origin browser does, and returns the
// status and the redirect target.
func (c *client) post(path string, form url.Values) (int, string) {
	c.t.Helper()
	req, err := http.NewRequestWithContext(c.t.Context(), http.MethodPost, c.base+path, strings.NewReader(form.Encode()))
	require.NoError(c.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, _ := c.do(req)
	return resp.StatusCode, resp.Header.Get("Location")
}

// form is vals plus the session's CSRF token.
func (c *client) form(kv ...string) url.Values {
	v := url.Values{"csrf": {c.csrf}}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Add(kv[i], kv[i+1])
	}
	return v
}

// login signs in as operator and keeps the session's CSRF token.
func (c *client) login(operator string) {
	c.t.Helper()
	status, loc := c.post("/login", url.Values{"operator": {operator}, "token": {operatorToken}})
	require.Equal(c.t, http.StatusSeeOther, status)
	require.Equal(c.t, "/", loc)
	status, page := c.get("/controls")
	require.Equal(c.t, http.StatusOK, status)
	m := csrfRE.FindStringSubmatch(page)
	require.NotNil(c.t, m, "the signed-in page carries the CSRF token")
	c.csrf = m[1]
}

// act posts an action form and returns the flash message shown after its
// redirect.
func (c *client) act(path string, kv ...string) string {
	c.t.Helper()
	status, loc := c.post(path, c.form(kv...))
	require.Equal(c.t, http.StatusSeeOther, status, "action %s", path)
	_, page := c.get(loc)
	m := regexp.MustCompile(`(?s)<div class="flash" id="flash">(.*?)</div>`).FindStringSubmatch(page)
	require.NotNil(c.t, m, "a flash after %s", path)
	return html.UnescapeString(m[1])
}

// job is the test workers' payload: its key is "order:<id>".
type job struct {
	ID string `json:"id"`
}

func (j job) IdempotencyKey() string { return "order:" + j.ID }

// startWorker runs an inboxmq worker with the runtime controls on b.queue:
// its handler records each effect in the effects table, and every
// delivery's handling result is sent on the returned channel.
func (b *testBundle) startWorker(t *testing.T) <-chan error {
	t.Helper()
	settled := make(chan error, 16)
	report := func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
		return func(ctx context.Context, d *inboxtype.Delivery) error {
			err := next(ctx, d)
			settled <- err
			return err
		}
	}
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[job]) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (key) VALUES ($1)`, msg.Body.IdempotencyKey())
		return err
	}, &inboxmq.RouteOpts{
		Concurrency: 1,
		Middleware:  []inboxtype.Middleware{report},
	})
	w, err := inboxmq.NewWorker(&inboxmq.Config{
		URL: testenv.AMQPURL(), DB: b.pool, Routes: routes, Name: "ui-test",
	})
	require.NoError(t, err)
	require.NoError(t, w.Start(t.Context()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})
	return settled
}

// isDuplicate reports whether a handling result is the inbox's duplicate.
func isDuplicate(err error) bool { return errors.Is(err, retry.ErrDuplicate) }

// actions reads inboxmq_ui_actions_total{action,result} from the registry.
func (b *testBundle) actions(t *testing.T, action, result string) float64 {
	t.Helper()
	mfs, err := b.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "inboxmq_ui_actions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["action"] == action && labels["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// newServer serves h for the test and returns its URL.
func newServer(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}
