package ui

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/internal/amqpdial"
	"github.com/inboxmq/inboxmq/internal/held"
	"github.com/inboxmq/inboxmq/internal/ops"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Console is the operator web console: an http.Handler serving the
// overview, the inbox search, the stale claims, the dead letters, the held
// keys of strict ordered routes and the runtime controls. Build it with
// [New]; it is safe for concurrent use.
type Console struct {
	cfg      Config
	mux      *http.ServeMux
	handler  http.Handler
	pages    map[string]*template.Template
	sessions *sessions
	actions  *prometheus.CounterVec
	controls *control.Store
	held     *held.Store

	mu    sync.Mutex
	store *inbox.Store
	conn  *amqp.Connection
}

// New returns a console configured by cfg. It does no I/O: the database
// and the broker are reached on the first page that needs them.
func New(cfg *Config) (*Console, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	con := &Console{
		cfg:      c,
		sessions: newSessions(c.SessionTTL),
		controls: control.NewStore(c.DB),
		held:     held.NewStore(c.DB),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inboxmq_ui_actions_total",
			Help: "Operator console actions by action and result (ok, error, refused).",
		}, []string{"action", "result"}),
	}
	if c.Registerer != nil {
		if err := c.Registerer.Register(con.actions); err != nil {
			return nil, fmt.Errorf("ui: register metrics: %w", err)
		}
	}
	if con.pages, err = parsePages(); err != nil {
		return nil, err
	}
	con.routes()
	return con, nil
}

// ServeHTTP serves the console.
func (con *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) { con.handler.ServeHTTP(w, r) }

// Close closes the console's broker connection, if one is open. The
// console reopens it if it serves again.
func (con *Console) Close() error {
	con.mu.Lock()
	defer con.mu.Unlock()
	if con.conn == nil {
		return nil
	}
	err := con.conn.Close()
	con.conn = nil
	if errors.Is(err, amqp.ErrClosed) {
		return nil
	}
	return err
}

func (con *Console) routes() {
	m := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	m.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	m.HandleFunc("GET /{$}", con.overview)
	m.HandleFunc("GET /login", con.loginPage)
	m.HandleFunc("POST /login", con.login)
	m.HandleFunc("POST /logout", con.logout)
	m.HandleFunc("GET /inbox", con.inboxSearch)
	m.HandleFunc("GET /inbox/row", con.inboxRow)
	m.HandleFunc("GET /claims", con.claims)
	m.HandleFunc("GET /claims/dry-run", con.claimsDryRun)
	m.HandleFunc("POST /claims/reconcile", con.action("reconcile", con.reconcile))
	m.HandleFunc("GET /dlq", con.dlq)
	m.HandleFunc("POST /dlq/replay", con.action("dlq_replay", con.dlqReplay))
	m.HandleFunc("GET /dlq/purge", con.dlqPurgePage)
	m.HandleFunc("POST /dlq/purge", con.action("dlq_purge", con.dlqPurge))
	m.HandleFunc("GET /held", con.heldPage)
	m.HandleFunc("POST /held/release", con.action("held_release", con.heldRelease))
	m.HandleFunc("POST /held/skip", con.action("held_skip", con.heldSkip))
	m.HandleFunc("GET /controls", con.controlsPage)
	m.HandleFunc("POST /controls/pause", con.action("pause", con.pause))
	m.HandleFunc("POST /controls/resume", con.action("resume", con.resume))
	m.HandleFunc("POST /controls/concurrency", con.action("concurrency", con.concurrency))
	m.HandleFunc("POST /controls/block", con.action("block", con.block))
	m.HandleFunc("POST /controls/unblock", con.action("unblock", con.unblock))
	con.mux = m
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		con.actions.WithLabelValues("cross_origin", "refused").Inc()
		con.refuse(w, r, "cross-origin request")
	}))
	con.handler = securityHeaders(cop.Handler(http.MaxBytesHandler(m, 1<<20)))
}

// securityHeaders sets the headers of every response: no inline script,
// no framing, no sniffing, no caching of pages that show messages.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		next.ServeHTTP(w, r)
	})
}

// inbox returns the inbox store, built on first use.
func (con *Console) inbox(ctx context.Context) (*inbox.Store, error) {
	con.mu.Lock()
	defer con.mu.Unlock()
	if con.store != nil {
		return con.store, nil
	}
	ctx, cancel := context.WithTimeout(ctx, con.cfg.QueryTimeout)
	defer cancel()
	s, err := inbox.NewStore(con.cfg.DB, con.cfg.Inbox)
	if err != nil {
		return nil, err
	}
	if err := s.Check(ctx); err != nil {
		return nil, err
	}
	con.store = s
	return s, nil
}

var errNoBroker = errors.New("ui: no broker configured (AMQPURL)")

// broker returns the broker connection, dialled on first use and again
// after it closed.
func (con *Console) broker() (*amqp.Connection, error) {
	if con.cfg.AMQPURL == "" {
		return nil, errNoBroker
	}
	con.mu.Lock()
	defer con.mu.Unlock()
	if con.conn != nil && !con.conn.IsClosed() {
		return con.conn, nil
	}
	d, err := amqpdial.New(amqpdial.Config{URL: con.cfg.AMQPURL, Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("ui: AMQPURL: %w", err)
	}
	conn, _, err := d.Dial(context.Background(), "inboxmq-ui", amqpdial.RoleAdmin)
	if err != nil {
		return nil, fmt.Errorf("ui: broker: %s", con.redact(err.Error()))
	}
	con.conn = conn
	return conn, nil
}

// queues returns the configured queues, or one per namespace of the inbox.
func (con *Console) queues(ctx context.Context) ([]Queue, error) {
	if len(con.cfg.Queues) > 0 {
		return con.cfg.Queues, nil
	}
	s, err := con.inbox(ctx)
	if err != nil {
		return nil, err
	}
	var names []string
	err = ops.Bounded(ctx, con.cfg.DB, con.cfg.QueryTimeout, func(tx pgx.Tx) error {
		var err error
		names, err = ops.Namespaces(ctx, tx, s.Table(), 100)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]Queue, 0, len(names))
	for _, n := range names {
		if q, err := (Queue{Name: n}).withDefaults(); err == nil {
			out = append(out, q)
		}
	}
	return out, nil
}

// queue finds the queue named name (a work queue or a namespace).
func (con *Console) queue(ctx context.Context, name string) (Queue, bool) {
	qs, err := con.queues(ctx)
	if err != nil {
		return Queue{}, false
	}
	for _, q := range qs {
		if q.Name == name || q.Namespace == name {
			return q, true
		}
	}
	return Queue{}, false
}

// redact removes the passwords of the broker and database URLs from s.
func (con *Console) redact(s string) string {
	nodes, _ := amqpdial.Parse(con.cfg.AMQPURL) // each node's password
	for _, n := range nodes {
		if u, err := url.Parse(n.URL); err == nil && u.User != nil {
			if p, ok := u.User.Password(); ok && p != "" {
				s = strings.ReplaceAll(s, p, "xxxxx")
			}
		}
	}
	if p := con.cfg.DB.Config().ConnConfig.Password; p != "" {
		s = strings.ReplaceAll(s, p, "xxxxx")
	}
	return s
}

// logger is the audit logger.
func (con *Console) logger() *slog.Logger { return con.cfg.Logger }
