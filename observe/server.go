package observe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/inboxmq/inboxmq/internal/startstop"
)

// DefaultAddr is the address the server listens on unless configured:
// loopback only, so that metrics and health are not exposed by accident.
const DefaultAddr = "127.0.0.1:9464"

// Check is one readiness check.
type Check struct {
	// Name identifies the check in the /readyz body ("broker", "database").
	Name string
	// Func returns nil when the dependency is fine. It gets a ctx bounded by
	// ServerConfig.CheckTimeout.
	Func func(ctx context.Context) error
	// Degraded marks a check whose failure does not make the process
	// unready: the body reports "degraded" (Redis: correctness holds without
	// it, only speed drops). Defaults to false: a failure makes /readyz 503.
	Degraded bool
}

// Ready returns a check that fails while ready() is false, such as the
// consumer's Ready method (connected and consuming).
func Ready(name string, ready func() bool) Check {
	return Check{Name: name, Func: func(context.Context) error {
		if !ready() {
			return errors.New("observe: " + name + " not ready")
		}
		return nil
	}}
}

// Pinger is what [Ping] needs: *pgxpool.Pool and *pgx.Conn implement it.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Ping returns a check that pings p (the database).
func Ping(name string, p Pinger) Check {
	return Check{Name: name, Func: p.Ping}
}

// DegradedFlag returns a non-fatal check that reports degraded while
// degraded() is true, such as metrics.Metrics.RedisDegraded.
func DegradedFlag(name string, degraded func() bool) Check {
	return Check{Name: name, Degraded: true, Func: func(context.Context) error {
		if degraded() {
			return errors.New("observe: " + name + " degraded")
		}
		return nil
	}}
}

// ServerConfig configures [NewServer]. A nil *ServerConfig means all
// defaults.
type ServerConfig struct {
	// Addr is the listen address. Defaults to [DefaultAddr] (loopback); set
	// ":9464" to expose it to a Prometheus on another host.
	Addr string
	// Gatherer is served on /metrics. Defaults to prometheus.DefaultGatherer.
	Gatherer prometheus.Gatherer
	// Checks decide /readyz. Defaults to none (always ready).
	Checks []Check
	// CheckTimeout bounds all checks of one /readyz request. Defaults to 2s.
	CheckTimeout time.Duration
	// ReadHeaderTimeout is the HTTP server's. Defaults to 5s.
	ReadHeaderTimeout time.Duration
}

// Server serves /metrics (Prometheus text or protobuf), /healthz (the
// process is alive: always 200) and /readyz (200 when every non-degraded
// check passes, else 503, with a JSON body naming each check). Build it
// with [NewServer]; the zero value is not usable.
type Server struct {
	cfg ServerConfig
	svc startstop.Service // the serving goroutine's lifecycle

	mu  sync.Mutex
	ln  net.Listener // of the last Start
	srv *http.Server // of the last Start
}

// NewServer builds a server; it does not listen until [Server.Start].
func NewServer(cfg *ServerConfig) *Server {
	var c ServerConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.Gatherer == nil {
		c.Gatherer = prometheus.DefaultGatherer
	}
	if c.CheckTimeout <= 0 {
		c.CheckTimeout = 2 * time.Second
	}
	if c.ReadHeaderTimeout <= 0 {
		c.ReadHeaderTimeout = 5 * time.Second
	}
	return &Server{cfg: c, svc: startstop.Service{Name: "observe: server"}}
}

// Handler returns the HTTP handler with the three endpoints, for mounting
// on a server of your own.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.cfg.Gatherer, promhttp.HandlerOpts{
		EnableOpenMetrics: true, // exemplars need OpenMetrics
		ErrorHandling:     promhttp.ContinueOnError,
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	return mux
}

// CheckResult is the state of one check in the /readyz body.
type CheckResult struct {
	OK       bool   `json:"ok"`
	Degraded bool   `json:"degraded,omitempty"`
	Error    string `json:"error,omitempty"`
}

// Readiness is the /readyz body. Status is "ready", "degraded" (ready, but a
// degraded check fails) or "not_ready".
type Readiness struct {
	Status string                 `json:"status"`
	Checks map[string]CheckResult `json:"checks"`
}

// Ready runs the checks concurrently and reports the result; /readyz
// serves it.
func (s *Server) Ready(ctx context.Context) Readiness {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CheckTimeout)
	defer cancel()
	results := make([]CheckResult, len(s.cfg.Checks))
	var wg sync.WaitGroup
	for i, c := range s.cfg.Checks {
		wg.Go(func() {
			if err := c.Func(ctx); err != nil {
				results[i] = CheckResult{Degraded: c.Degraded, Error: err.Error()}
				return
			}
			results[i] = CheckResult{OK: true}
		})
	}
	wg.Wait()
	r := Readiness{Status: "ready", Checks: make(map[string]CheckResult, len(results))}
	for i, c := range s.cfg.Checks {
		res := results[i]
		r.Checks[c.Name] = res
		switch {
		case res.OK:
		case c.Degraded:
			if r.Status == "ready" {
				r.Status = "degraded"
			}
		default:
			r.Status = "not_ready"
		}
	}
	return r
}

func (s *Server) readyz(w http.ResponseWriter, req *http.Request) {
	r := s.Ready(req.Context())
	code := http.StatusOK
	if r.Status == "not_ready" {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, r)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// Start listens on the configured address and serves in the background; it
// returns once the listener is open (or with the error opening it). ctx
// bounds only the listen; the server runs until [Server.Stop]. A Start
// while the server runs returns an error; a stopped server may be started
// again.
func (s *Server) Start(ctx context.Context) error {
	return s.svc.Start(ctx, s.listen, s.serve)
}

// Stop stops the server gracefully: it closes the listener, then waits for
// the requests in flight, bounded by ctx (if ctx ends first, it returns an
// error joined with ctx.Err() and those requests finish in the
// background). It is idempotent and safe without Start.
func (s *Server) Stop(ctx context.Context) error { return s.svc.Stop(ctx) }

// Stopped returns a channel closed when the server started by the last
// Start has stopped and answered its last request (closed before any
// Start).
func (s *Server) Stopped() <-chan struct{} { return s.svc.Stopped() }

func (s *Server) listen(ctx context.Context) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("observe: listen %s: %w", s.cfg.Addr, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ln = ln
	// An http.Server does not serve again after a shutdown: one per Start.
	s.srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: s.cfg.ReadHeaderTimeout}
	return nil
}

// serve serves until ctx ends, then shuts the server down, waiting for the
// requests in flight.
func (s *Server) serve(ctx context.Context) error {
	s.mu.Lock()
	srv, ln := s.srv, s.ln
	s.mu.Unlock()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served: // the listener failed
		return fmt.Errorf("observe: serve: %w", err)
	case <-ctx.Done():
	}
	// Stop bounds the caller's wait, not the shutdown: requests in flight
	// are answered even after Stop gave up waiting for them.
	err := srv.Shutdown(context.WithoutCancel(ctx))
	if serr := <-served; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, fmt.Errorf("observe: serve: %w", serr))
	}
	return err
}

// Addr returns the address the server listens on (useful with port 0), or
// the configured address before Start.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return s.ln.Addr().String()
	}
	return s.cfg.Addr
}

// ListenAndServe is Start, then Stop once ctx is done (allowing 5s for
// in-flight scrapes): a blocking call for a server run on a goroutine of
// its own. It returns nil after a clean stop.
func (s *Server) ListenAndServe(ctx context.Context) error {
	if err := s.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return s.Stop(sctx)
}
