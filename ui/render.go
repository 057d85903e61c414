package ui

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/internal/amqpdial"
)

// pageNames are the templates, each rendered inside layout.html.
var pageNames = []string{"overview", "login", "refused", "inbox", "row", "claims", "dlq", "purge", "held", "controls", "error"}

var funcs = template.FuncMap{
	"since": func(t time.Time) string { return ago(time.Since(t)) },
	"ago":   ago,
	"tm": func(t any) string {
		switch v := t.(type) {
		case time.Time:
			return v.UTC().Format("2006-01-02 15:04:05Z")
		case *time.Time:
			if v == nil {
				return "–"
			}
			return v.UTC().Format("2006-01-02 15:04:05Z")
		}
		return "–"
	},
	"str": func(p *string) string {
		if p == nil {
			return "–"
		}
		return *p
	},
	"add":     func(a, b int) int { return a + b },
	"bytes":   bytesText,
	"headers": headerLines,
}

func ago(d time.Duration) string {
	switch {
	case d < 0:
		return "in " + ago(-d)
	case d < time.Second:
		return "now"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}

func bytesText(n int) string {
	switch {
	case n < 1024:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/1024)
	default:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
}

// headerLine is one AMQP header as the dead-letter page shows it.
type headerLine struct{ Name, Value string }

// headerLines renders a header table, sorted, nested tables as JSON.
func headerLines(h amqp.Table) []headerLine {
	out := make([]headerLine, 0, len(h))
	for k, v := range h {
		var s string
		switch x := v.(type) {
		case string:
			s = x
		case []byte:
			s = strings.ToValidUTF8(string(x), "\uFFFD")
		case amqp.Table, []any:
			b, err := json.Marshal(x)
			if err != nil {
				s = fmt.Sprint(x)
			} else {
				s = string(b)
			}
		default:
			s = fmt.Sprint(x)
		}
		out = append(out, headerLine{Name: k, Value: clip(s, 4096)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + fmt.Sprintf("… [%d bytes]", len(s))
}

// bodyView is a message body or stored payload as shown: pretty JSON when
// it parses, text otherwise (escaped by the template, never interpreted).
type bodyView struct {
	Text      string
	JSON      bool
	Binary    bool
	Truncated bool
	Bytes     int
}

func viewBody(head []byte, total int) bodyView {
	v := bodyView{Bytes: total, Truncated: len(head) < total}
	var buf bytes.Buffer
	if !v.Truncated && json.Valid(head) && json.Indent(&buf, head, "", "  ") == nil {
		v.Text, v.JSON = buf.String(), true
		return v
	}
	if !utf8.Valid(head) {
		v.Binary = true
		v.Text = strings.ToValidUTF8(string(head), "\uFFFD")
		return v
	}
	v.Text = string(head)
	return v
}

// page is what every template gets: the layout's fields and the page's.
type page struct {
	Title    string
	Base     string
	Path     string
	Operator string
	CSRF     string
	Flash    string
	Refresh  int
	Broker   string
	Data     any
}

func parsePages() (map[string]*template.Template, error) {
	out := make(map[string]*template.Template, len(pageNames))
	for _, n := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/workers.html", "templates/"+n+".html")
		if err != nil {
			return nil, fmt.Errorf("ui: parse %s: %w", n, err)
		}
		out[n] = t
	}
	return out, nil
}

// titled lets a page's data name its title.
type titled interface{ title() string }

func (con *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, data any) {
	p := page{Base: con.cfg.BasePath, Path: r.URL.Path, Data: data, Broker: "none"}
	if con.cfg.AMQPURL != "" {
		p.Broker = amqpdial.Redact(con.cfg.AMQPURL)
	}
	if t, ok := data.(titled); ok {
		p.Title = t.title()
	}
	if ss := con.sessions.get(r); ss != nil {
		p.Operator, p.CSRF = ss.operator, ss.csrf
		p.Flash = con.sessions.takeFlash(ss)
	}
	if name == "overview" && con.cfg.Refresh > 0 {
		p.Refresh = max(int(con.cfg.Refresh.Seconds()), 1)
	}
	var buf bytes.Buffer
	if err := con.pages[name].ExecuteTemplate(&buf, "layout.html", &p); err != nil {
		con.logger().LogAttrs(r.Context(), slog.LevelError, "ui: render", slog.String("page", name), slog.Any("error", err))
		http.Error(w, "ui: render failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

type errorData struct{ Message string }

func (errorData) title() string { return "Error" }

// fail renders an error page (the message redacted).
func (con *Console) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	con.render(w, r, status, "error", errorData{Message: con.redact(err.Error())})
}
