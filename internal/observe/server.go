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

// CheckError is an error a check may return to say since when it has been
// failing and which threshold it applies: /healthz and /readyz show both
// next to the error. A check that returns another error is shown with the
// time the server first saw it fail, in its run of failures.
type CheckError struct {
	// Err is why the check fails.
	Err error
	// Since is when the failing condition began. Zero means unknown.
	Since time.Time
	// Threshold is the limit the check applies. Zero means none.
	Threshold time.Duration
}

func (e *CheckError) Error() string { return e.Err.Error() }

func (e *CheckError) Unwrap() error { return e.Err }

// Watchdog returns a liveness check that fails while progress reports
// work in flight and no progress for longer than threshold: a consumer
// loop or a settlement that is stuck, which only a restart cures. It never
// fails while nothing is in flight (an idle or paused consumer). progress
// returns the work in flight and the time of the last progress, such as a
// consumer's Progress. A threshold of zero or less disables the check.
func Watchdog(name string, progress func() (inFlight int, last time.Time), threshold time.Duration) Check {
	return Check{Name: name, Func: func(context.Context) error {
		if threshold <= 0 {
			return nil
		}
		inFlight, last := progress()
		if inFlight == 0 || last.IsZero() {
			return nil
		}
		if stuck := time.Since(last); stuck > threshold {
			return &CheckError{
				Err:       fmt.Errorf("observe: %s: %d deliveries in flight and none settled for %s", name, inFlight, stuck.Round(time.Second)),
				Since:     last,
				Threshold: threshold,
			}
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
	// Liveness checks decide /healthz: 503 while any fails, such as a
	// [Watchdog]. Their Degraded field is ignored. Defaults to none: 200
	// while the process answers HTTP.
	Liveness []Check
	// CheckTimeout bounds all checks of one /readyz request. Defaults to 2s.
	CheckTimeout time.Duration
	// ReadHeaderTimeout is the HTTP server's. Defaults to 5s.
	ReadHeaderTimeout time.Duration
}

// Server serves /metrics (Prometheus text or protobuf), /healthz (200
// while every liveness check passes, else 503) and /readyz (200 when every
// non-degraded check passes, else 503), each with a JSON body naming every
// check, and for a failing one its error, since when it fails and its
// threshold. Build it with [NewServer]; the zero value is not usable.
type Server struct {
	cfg ServerConfig
	svc startstop.Service // the serving goroutine's lifecycle

	failMu    sync.Mutex
	failSince map[string]time.Time // first failure seen, per endpoint and check

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
	return &Server{cfg: c, svc: startstop.Service{Name: "observe: server"}, failSince: map[string]time.Time{}}
}

// Handler returns the HTTP handler with the three endpoints, for mounting
// on a server of your own.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.cfg.Gatherer, promhttp.HandlerOpts{
		EnableOpenMetrics: true, // exemplars need OpenMetrics
		ErrorHandling:     promhttp.ContinueOnError,
	}))
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	return mux
}

// CheckResult is the state of one check in the /readyz and /healthz
// bodies.
type CheckResult struct {
	OK       bool   `json:"ok"`
	Degraded bool   `json:"degraded,omitempty"`
	Error    string `json:"error,omitempty"`
	// Since is when the check began to fail: from its [CheckError], else
	// when this server first saw it fail in its current run of failures.
	Since *time.Time `json:"since,omitempty"`
	// Threshold is the limit the failing check applies (a [CheckError]'s),
	// as a Go duration ("5m0s").
	Threshold string `json:"threshold,omitempty"`
}

// Readiness is the /readyz body. Status is "ready", "degraded" (ready, but a
// degraded check fails) or "not_ready".
type Readiness struct {
	Status string                 `json:"status"`
	Checks map[string]CheckResult `json:"checks"`
}

// Liveness is the /healthz body. Status is "ok" or "failing".
type Liveness struct {
	Status string                 `json:"status"`
	Checks map[string]CheckResult `json:"checks,omitempty"`
}

// Ready runs the checks concurrently and reports the result; /readyz
// serves it.
func (s *Server) Ready(ctx context.Context) Readiness {
	results := s.run(ctx, "readyz", s.cfg.Checks)
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

// Live runs the liveness checks concurrently and reports the result;
// /healthz serves it.
func (s *Server) Live(ctx context.Context) Liveness {
	results := s.run(ctx, "healthz", s.cfg.Liveness)
	l := Liveness{Status: "ok", Checks: make(map[string]CheckResult, len(results))}
	for i, c := range s.cfg.Liveness {
		res := results[i]
		res.Degraded = false
		l.Checks[c.Name] = res
		if !res.OK {
			l.Status = "failing"
		}
	}
	return l
}

// run runs checks concurrently, bounded by CheckTimeout, and keeps the
// start of each check's run of failures (under endpoint).
func (s *Server) run(ctx context.Context, endpoint string, checks []Check) []CheckResult {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CheckTimeout)
	defer cancel()
	errs := make([]error, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Go(func() { errs[i] = c.Func(ctx) })
	}
	wg.Wait()
	now := time.Now()
	results := make([]CheckResult, len(checks))
	s.failMu.Lock()
	defer s.failMu.Unlock()
	for i, c := range checks {
		key := endpoint + "/" + c.Name
		err := errs[i]
		if err == nil {
			delete(s.failSince, key)
			results[i] = CheckResult{OK: true}
			continue
		}
		since, seen := s.failSince[key]
		if !seen {
			since = now
			s.failSince[key] = now
		}
		res := CheckResult{Degraded: c.Degraded, Error: err.Error()}
		var ce *CheckError
		if errors.As(err, &ce) {
			if !ce.Since.IsZero() {
				since = ce.Since
			}
			if ce.Threshold > 0 {
				res.Threshold = ce.Threshold.String()
			}
		}
		res.Since = &since
		results[i] = res
	}
	return results
}

func (s *Server) readyz(w http.ResponseWriter, req *http.Request) {
	r := s.Ready(req.Context())
	code := http.StatusOK
	if r.Status == "not_ready" {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, r)
}

func (s *Server) healthz(w http.ResponseWriter, req *http.Request) {
	l := s.Live(req.Context())
	code := http.StatusOK
	if l.Status != "ok" {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, l)
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
