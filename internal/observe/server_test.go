package observe_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/observe"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/startstop"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

type testBundle struct {
	srv    *observe.Server
	ready  *atomic.Bool
	redis  *atomic.Bool
	reg    *prometheus.Registry
	client *http.Client
}

func setup(t *testing.T, extra ...observe.Check) *testBundle {
	t.Helper()
	b := &testBundle{ready: &atomic.Bool{}, redis: &atomic.Bool{}, reg: prometheus.NewRegistry(), client: &http.Client{}}
	b.ready.Store(true)
	checks := append([]observe.Check{
		observe.Ready("broker", b.ready.Load),
		observe.DegradedFlag("redis", b.redis.Load),
	}, extra...)
	b.srv = observe.NewServer(&observe.ServerConfig{Addr: "127.0.0.1:0", Gatherer: b.reg, Checks: checks})
	require.NoError(t, b.srv.Start(t.Context()))
	t.Cleanup(func() { require.NoError(t, b.srv.Stop(context.Background())) })
	return b
}

func (b *testBundle) get(t *testing.T, path string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+b.srv.Addr()+path, nil)
	require.NoError(t, err)
	resp, err := b.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

func readiness(t *testing.T, body string) observe.Readiness {
	t.Helper()
	var r observe.Readiness
	require.NoError(t, json.Unmarshal([]byte(body), &r))
	return r
}

func TestServer_Healthz(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.ready.Store(false)
	code, body := b.get(t, "/healthz")
	require.Equal(t, http.StatusOK, code, "liveness ignores readiness")
	require.JSONEq(t, `{"status":"ok"}`, body)
}

func TestServer_Readyz(t *testing.T) {
	t.Parallel()
	b := setup(t)

	code, body := b.get(t, "/readyz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ready", readiness(t, body).Status)

	b.ready.Store(false)
	code, body = b.get(t, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	r := readiness(t, body)
	require.Equal(t, "not_ready", r.Status)
	require.False(t, r.Checks["broker"].OK)
	require.Contains(t, r.Checks["broker"].Error, "broker not ready")
	require.True(t, r.Checks["redis"].OK)

	b.ready.Store(true)
	code, _ = b.get(t, "/readyz")
	require.Equal(t, http.StatusOK, code, "ready again once the check passes")

	b.redis.Store(true)
	code, body = b.get(t, "/readyz")
	require.Equal(t, http.StatusOK, code, "a degraded Redis keeps the worker ready")
	r = readiness(t, body)
	require.Equal(t, "degraded", r.Status)
	require.True(t, r.Checks["redis"].Degraded)
}

func TestServer_ReadyzDatabasePing(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Schema(t)
	b := setup(t, observe.Ping("database", pool))
	code, body := b.get(t, "/readyz")
	require.Equal(t, http.StatusOK, code, body)
	require.True(t, readiness(t, body).Checks["database"].OK)

	pool.Close()
	code, body = b.get(t, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.False(t, readiness(t, body).Checks["database"].OK)
}

func TestServer_CheckTimeout(t *testing.T) {
	t.Parallel()
	srv := observe.NewServer(&observe.ServerConfig{CheckTimeout: 1, Checks: []observe.Check{{
		Name: "slow", Func: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() },
	}}})
	r := srv.Ready(t.Context())
	require.Equal(t, "not_ready", r.Status)
	require.Contains(t, r.Checks["slow"].Error, "deadline")
}

func TestServer_Metrics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "inboxmq_test_total", Help: "A test counter."})
	b.reg.MustRegister(c)
	c.Add(3)
	code, body := b.get(t, "/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "inboxmq_test_total 3")
}

// TestServer_Lifecycle: Stop without Start and Stop twice are safe, a
// second Start is refused, Stop closes the listener and waits for the
// serving goroutine, and a stopped server starts again.
func TestServer_Lifecycle(t *testing.T) {
	t.Parallel()
	srv := observe.NewServer(&observe.ServerConfig{Addr: "127.0.0.1:0"})
	require.Equal(t, "127.0.0.1:0", srv.Addr())
	require.NoError(t, srv.Stop(t.Context()), "Stop without Start")
	require.NoError(t, srv.Start(t.Context()))
	require.ErrorIs(t, srv.Start(t.Context()), startstop.ErrAlreadyStarted, "second start")
	addr := srv.Addr()
	require.NotEqual(t, "127.0.0.1:0", addr)
	b := &testBundle{srv: srv, client: &http.Client{}}
	code, _ := b.get(t, "/healthz")
	require.Equal(t, http.StatusOK, code)

	stopped := srv.Stopped()
	require.NoError(t, srv.Stop(t.Context()))
	select {
	case <-stopped:
	default:
		t.Fatal("Stop returned before the serving goroutine ended")
	}
	require.NoError(t, srv.Stop(t.Context()), "Stop twice")
	_, err := net.Dial("tcp", addr)
	require.Error(t, err, "the listener is closed")

	require.NoError(t, srv.Start(t.Context()), "a stopped server starts again")
	code, _ = b.get(t, "/healthz")
	require.Equal(t, http.StatusOK, code)
	require.NoError(t, srv.Stop(t.Context()))

	require.Equal(t, observe.DefaultAddr, observe.NewServer(nil).Addr())

	bad := observe.NewServer(&observe.ServerConfig{Addr: "256.0.0.1:1"})
	require.Error(t, bad.Start(t.Context()))
	require.NoError(t, bad.Stop(t.Context()), "Stop after a failed Start")
}

// TestServer_StopBoundedByCtx: a scrape that does not finish does not hold
// Stop past its ctx; the server finishes in the background.
func TestServer_StopBoundedByCtx(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	srv := observe.NewServer(&observe.ServerConfig{Addr: "127.0.0.1:0", Checks: []observe.Check{{
		Name: "stuck", Func: func(context.Context) error { close(entered); <-release; return nil },
	}}})
	require.NoError(t, srv.Start(t.Context()))
	b := &testBundle{srv: srv, client: &http.Client{}}
	got := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+srv.Addr()+"/readyz", nil)
		resp, err := b.client.Do(req)
		if err != nil {
			got <- 0
			return
		}
		_ = resp.Body.Close()
		got <- resp.StatusCode
	}()
	testenv.WaitChan(t, entered, "the scrape is in flight")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.ErrorIs(t, srv.Stop(ctx), context.Canceled)
	close(release)
	require.Equal(t, http.StatusOK, testenv.WaitChan(t, got, "the in-flight scrape is answered"))
	testenv.WaitChan(t, srv.Stopped(), "the server finishes in the background")
	require.NoError(t, srv.Stop(t.Context()))
}

func TestServer_ListenAndServeStopsOnCtx(t *testing.T) {
	t.Parallel()
	srv := observe.NewServer(&observe.ServerConfig{Addr: "127.0.0.1:0"})
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe(ctx) }()
	testenv.WaitFor(t, "the server listens", func() bool { return srv.Addr() != "127.0.0.1:0" })
	cancel()
	require.NoError(t, testenv.WaitChan(t, errc, "ListenAndServe returns"))
}

// The listener binds to loopback unless configured otherwise: metrics and
// health are not exposed by accident.
func TestServer_DefaultAddrIsLoopback(t *testing.T) {
	t.Parallel()
	s := observe.NewServer(nil)
	host, port, err := net.SplitHostPort(s.Addr())
	require.NoError(t, err)
	require.True(t, net.ParseIP(host).IsLoopback(), "default host %q", host)
	require.Equal(t, "9464", port)
}
