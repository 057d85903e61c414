package inboxmq_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/observe"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/redistest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// healthBody is a /healthz or /readyz answer.
type healthBody struct {
	Code   int
	Status string                         `json:"status"`
	Checks map[string]observe.CheckResult `json:"checks"`
}

func getHealth(t *testing.T, rawURL string) healthBody {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, rawURL, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return healthBody{}
	}
	defer resp.Body.Close()
	var b healthBody
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&b))
	b.Code = resp.StatusCode
	return b
}

// startHealthWorker starts a worker with cfg's Health listener on a free
// port, stopped when the test ends, and waits until it is ready.
func startHealthWorker(t *testing.T, cfg *inboxmq.Config) (health string) {
	t.Helper()
	health = freeAddr(t)
	cfg.Addr = health
	w, err := inboxmq.NewWorker(cfg)
	require.NoError(t, err)
	require.NoError(t, w.Start(t.Context()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = w.Stop(ctx)
	})
	testenv.WaitFor(t, "the worker is ready", func() bool {
		return getHealth(t, "http://"+health+"/readyz").Code == http.StatusOK
	})
	return health
}

// A handler that never returns (and ignores its context): /healthz turns
// 503 while it is stuck and says why, since when (the delivery was taken
// up: after it was published, before the answer) and the threshold; once
// the handler returns and its delivery settles, /healthz is 200 again.
// /readyz stays 200: the worker is connected, only stuck. When the check
// fires after its threshold is observe's to test (TestWatchdog_*): here
// the test waits for the answer, and measures no time.
func TestWorker_HealthzFailsWhileAHandlerIsStuck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		close(entered)
		<-release // stuck: does not even watch ctx
		return nil
	}, nil)
	const threshold = 300 * time.Millisecond
	health := startHealthWorker(t, &inboxmq.Config{
		URL: testenv.AMQPURL(), DB: b.pool, Routes: routes,
		HandlerTimeout: -1,
		StallThreshold: threshold,
	})
	t.Cleanup(unblock) // runs before the worker stops and the pool closes
	require.Equal(t, http.StatusOK, getHealth(t, "http://"+health+"/healthz").Code)

	published := time.Now()
	b.pub.Publish(b.queue, []byte(`{"id":"stuck"}`), amqp.Publishing{MessageId: "m1"})
	testenv.WaitChan(t, entered, "the handler runs")
	var h healthBody
	testenv.WaitFor(t, "/healthz to answer 503 while the handler is stuck (the consumer's watchdog never fired)", func() bool {
		h = getHealth(t, "http://"+health+"/healthz")
		return h.Code == http.StatusServiceUnavailable
	})
	answered := time.Now()
	require.Equal(t, "failing", h.Status)
	c := h.Checks["consumer"]
	require.False(t, c.OK)
	require.Contains(t, c.Error, "1 deliveries in flight and none settled")
	require.Equal(t, threshold.String(), c.Threshold)
	require.NotNil(t, c.Since)
	require.False(t, c.Since.Before(published), "since %s: not before the delivery was published (%s)", c.Since, published)
	require.False(t, c.Since.After(answered), "since %s: not after the answer (%s)", c.Since, answered)
	require.Equal(t, http.StatusOK, getHealth(t, "http://"+health+"/readyz").Code, "connected: ready, only not live")

	unblock()
	testenv.WaitFor(t, "/healthz recovers once the delivery settles", func() bool {
		return getHealth(t, "http://"+health+"/healthz").Code == http.StatusOK
	})
}

// An idle worker makes no progress and is live all the same.
func TestWorker_HealthzStaysOKWhileIdle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, noop[order], nil)
	health := startHealthWorker(t, &inboxmq.Config{
		URL: testenv.AMQPURL(), DB: b.pool, Routes: routes,
		StallThreshold: 50 * time.Millisecond,
	})
	// One delivery handled, then nothing: idle for many thresholds.
	b.pub.Publish(b.queue, []byte(`{"id":"a"}`), amqp.Publishing{MessageId: "a"})
	require.Never(t, func() bool {
		h := getHealth(t, "http://"+health+"/healthz")
		return h.Code != http.StatusOK || !h.Checks["consumer"].OK
	}, time.Second, 20*time.Millisecond)
}

// The broker's network goes away (a proxy drops every connection and
// holds new ones): /readyz is 503 and names "broker" while it lasts, and
// 200 again once the consumer has reconnected.
func TestWorker_ReadyzFailsWhileTheBrokerIsDown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	u, err := url.Parse(testenv.AMQPURL())
	require.NoError(t, err)
	proxy := redistest.NewProxyTo(t, u.Host)
	u.Host = proxy.Addr()
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, noop[order], nil)
	health := startHealthWorker(t, &inboxmq.Config{URL: u.String(), DB: b.pool, Routes: routes, ConnectTimeout: time.Second})

	proxy.Pause()
	proxy.Drop()
	var h healthBody
	testenv.WaitFor(t, "/readyz fails", func() bool {
		h = getHealth(t, "http://"+health+"/readyz")
		return h.Code == http.StatusServiceUnavailable
	})
	require.Equal(t, "not_ready", h.Status)
	require.False(t, h.Checks["broker"].OK)
	require.NotNil(t, h.Checks["broker"].Since)
	require.True(t, h.Checks["database"].OK)
	require.Equal(t, http.StatusOK, getHealth(t, "http://"+health+"/healthz").Code, "disconnected is not stuck")

	proxy.Resume()
	testenv.WaitFor(t, "/readyz recovers", func() bool {
		return getHealth(t, "http://"+health+"/readyz").Code == http.StatusOK
	})
}

// PostgreSQL stops answering (a proxy holds every byte): /readyz is 503
// and names "database"; it is 200 again once PostgreSQL answers.
func TestWorker_ReadyzFailsWhileTheDatabaseIsUnreachable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, schema := pgtest.Schema(t) // the inbox tables, reached through the proxy below
	cfg, err := pgxpool.ParseConfig(pgtest.URL(schema))
	require.NoError(t, err)
	proxy := redistest.NewProxyTo(t, cfg.ConnConfig.Host+":"+itoa(int(cfg.ConnConfig.Port)))
	host, port, _ := splitHostPort(proxy.Addr())
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, port
	cfg.ConnConfig.ConnectTimeout = time.Second
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, noop[order], nil)
	health := startHealthWorker(t, &inboxmq.Config{URL: testenv.AMQPURL(), DB: pool, Routes: routes})

	proxy.Pause()
	var h healthBody
	testenv.WaitFor(t, "/readyz fails", func() bool {
		h = getHealth(t, "http://"+health+"/readyz")
		return h.Code == http.StatusServiceUnavailable
	})
	require.False(t, h.Checks["database"].OK)
	require.NotEmpty(t, h.Checks["database"].Error)
	require.True(t, h.Checks["broker"].OK)

	proxy.Drop()
	proxy.Resume()
	testenv.WaitFor(t, "/readyz recovers", func() bool {
		return getHealth(t, "http://"+health+"/readyz").Code == http.StatusOK
	})
}

func itoa(n int) string { return strconv.Itoa(n) }

func splitHostPort(addr string) (string, uint16, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.ParseUint(p, 10, 16)
	return host, uint16(n), err
}
