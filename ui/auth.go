package ui

import (
	"crypto/rand"
	"crypto/subtle"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// sessionCookie names the cookie of a signed-in operator.
const sessionCookie = "inboxmq_ui_session"

// maxSessions bounds the sign-ins kept in memory.
const maxSessions = 1000

// session is one signed-in browser: the operator's name and the token its
// forms must carry (CSRF).
type session struct {
	operator string
	csrf     string
	expires  time.Time
	flash    string
}

type sessions struct {
	ttl time.Duration
	mu  sync.Mutex
	m   map[string]*session
}

func newSessions(ttl time.Duration) *sessions {
	return &sessions{ttl: ttl, m: make(map[string]*session)}
}

// start opens a session for operator and returns its id, or "" when too
// many sessions are open.
func (s *sessions) start(operator string) (string, *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for id, ss := range s.m {
		if now.After(ss.expires) {
			delete(s.m, id)
		}
	}
	if len(s.m) >= maxSessions {
		return "", nil
	}
	id := rand.Text() + rand.Text()
	ss := &session{operator: operator, csrf: rand.Text() + rand.Text(), expires: now.Add(s.ttl)}
	s.m[id] = ss
	return id, ss
}

// get returns the live session of r, or nil.
func (s *sessions) get(r *http.Request) *session {
	ck, err := r.Cookie(sessionCookie)
	if err != nil || ck.Value == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.m[ck.Value]
	if ss == nil || time.Now().After(ss.expires) {
		delete(s.m, ck.Value)
		return nil
	}
	return ss
}

func (s *sessions) end(r *http.Request) {
	if ck, err := r.Cookie(sessionCookie); err == nil {
		s.mu.Lock()
		delete(s.m, ck.Value)
		s.mu.Unlock()
	}
}

// setFlash and takeFlash carry an action's outcome across its redirect.
func (s *sessions) setFlash(ss *session, msg string) {
	s.mu.Lock()
	ss.flash = msg
	s.mu.Unlock()
}

func (s *sessions) takeFlash(ss *session) string {
	if ss == nil {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	f := ss.flash
	ss.flash = ""
	return f
}

func equalSecret(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// cleanOperator keeps a printable, bounded operator name.
func cleanOperator(s string) string {
	s = strings.TrimSpace(s)
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, s)
	for len(s) > 64 {
		_, n := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-n]
	}
	return s
}

func (con *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	con.render(w, r, http.StatusOK, "login", &loginData{Next: safeNext(con, r.URL.Query().Get("next"))})
}

type loginData struct {
	Next  string
	Error string
}

// safeNext keeps a redirect target inside the console.
func safeNext(con *Console, next string) string {
	if next == "" || !strings.HasPrefix(next, con.cfg.BasePath+"/") || strings.HasPrefix(next, "//") || strings.Contains(next, "\\") {
		return con.cfg.BasePath + "/"
	}
	return next
}

func (con *Console) login(w http.ResponseWriter, r *http.Request) {
	operator := cleanOperator(r.PostFormValue("operator"))
	next := safeNext(con, r.PostFormValue("next"))
	if !equalSecret(r.PostFormValue("token"), con.cfg.Token) || operator == "" {
		con.actions.WithLabelValues("login", "refused").Inc()
		con.audit(r, "login", "refused", slog.String("operator", operator))
		con.render(w, r, http.StatusForbidden, "login", &loginData{Next: next, Error: "Wrong operator token, or no name given."})
		return
	}
	id, _ := con.sessions.start(operator)
	if id == "" {
		con.audit(r, "login", "refused", slog.String("operator", operator), slog.String("error", "too many sessions"))
		http.Error(w, "too many open sessions", http.StatusServiceUnavailable)
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: id, Path: con.cfg.BasePath + "/", HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode, MaxAge: int(con.cfg.SessionTTL.Seconds()),
	})
	con.actions.WithLabelValues("login", "ok").Inc()
	con.audit(r, "login", "ok", slog.String("operator", operator))
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (con *Console) logout(w http.ResponseWriter, r *http.Request) {
	if ss := con.sessions.get(r); ss != nil && equalSecret(r.PostFormValue("csrf"), ss.csrf) {
		con.sessions.end(r)
		con.audit(r, "logout", "ok", slog.String("operator", ss.operator))
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: con.cfg.BasePath + "/", MaxAge: -1, HttpOnly: true})
	http.Redirect(w, r, con.cfg.BasePath+"/", http.StatusSeeOther)
}

// actionFunc performs one state change for operator and returns what to
// tell the operator, the page to go back to, the audit attributes and the
// error.
type actionFunc func(r *http.Request, actor string) (result actionResult)

type actionResult struct {
	flash string
	back  string
	attrs []slog.Attr
	err   error
}

// action wraps a state change: it needs a signed-in session (the
// operator token) and the session's CSRF token in the form; it is audited
// and counted, and answers with a redirect to the page it came from.
func (con *Console) action(name string, fn actionFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ss := con.sessions.get(r)
		if ss == nil {
			con.actions.WithLabelValues(name, "refused").Inc()
			con.refuse(w, r, "operator token required: sign in first")
			return
		}
		if !equalSecret(r.PostFormValue("csrf"), ss.csrf) {
			con.actions.WithLabelValues(name, "refused").Inc()
			con.refuse(w, r, "missing or wrong form token (CSRF)")
			return
		}
		actor := "ui:" + ss.operator + "@" + remoteHost(r)
		res := fn(r, actor)
		attrs := append([]slog.Attr{slog.String("operator", ss.operator)}, res.attrs...)
		result := "ok"
		flash := res.flash
		if res.err != nil {
			result = "error"
			msg := con.redact(res.err.Error())
			attrs = append(attrs, slog.String("error", msg))
			flash = "Failed: " + msg
		}
		con.actions.WithLabelValues(name, result).Inc()
		con.audit(r, name, result, attrs...)
		con.sessions.setFlash(ss, flash)
		http.Redirect(w, r, con.cfg.BasePath+res.back, http.StatusSeeOther)
	}
}

// refuse answers 403 and logs the refusal.
func (con *Console) refuse(w http.ResponseWriter, r *http.Request, why string) {
	con.audit(r, r.Method+" "+r.URL.Path, "refused", slog.String("reason", why))
	con.render(w, r, http.StatusForbidden, "refused", &refusedData{Reason: why})
}

type refusedData struct{ Reason string }

// audit writes one audit line.
func (con *Console) audit(r *http.Request, action, result string, attrs ...slog.Attr) {
	all := append([]slog.Attr{
		slog.String("action", action), slog.String("result", result), slog.String("remote", r.RemoteAddr),
	}, attrs...)
	level := slog.LevelInfo
	if result != "ok" {
		level = slog.LevelWarn
	}
	con.logger().LogAttrs(r.Context(), level, "ui: audit", all...)
}

func remoteHost(r *http.Request) string {
	h := r.RemoteAddr
	if i := strings.LastIndexByte(h, ':'); i > 0 {
		h = h[:i]
	}
	return strings.Trim(h, "[]")
}
