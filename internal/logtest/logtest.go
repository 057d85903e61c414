// Package logtest records the log lines that inboxmq's packages write
// through a *slog.Logger, so that tests can assert them: their message,
// level and attributes. It is a test helper, never imported by production
// code.
package logtest

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
)

// Entry is one recorded line. Attrs holds each attribute by its key (a
// group's members as "group.key"), with the value resolved to a plain Go
// value: string, int64, uint64, float64, bool, time.Duration, time.Time,
// or, for an error, its text (as a JSON handler writes it); any other value
// as it was given. An attribute whose value is nil is recorded as nil.
type Entry struct {
	Level   slog.Level
	Message string
	Attrs   map[string]any
}

// Recorder is a slog.Handler that keeps every record it handles at or
// above its level. Loggers derived from it (With, WithGroup) record into
// the same list. It is safe for concurrent use.
type Recorder struct {
	level  slog.Leveler
	prefix string      // the open groups, each followed by "."
	attrs  []slog.Attr // from WithAttrs, already prefixed
	shared *entries
}

type entries struct {
	mu   sync.Mutex
	list []Entry
}

var _ slog.Handler = (*Recorder)(nil)

// New returns a logger that records every line at or above level, and its
// recorder.
func New(level slog.Leveler) (*slog.Logger, *Recorder) {
	r := &Recorder{level: level, shared: &entries{}}
	return slog.New(r), r
}

// Enabled reports whether level is at or above the recorder's level.
func (r *Recorder) Enabled(_ context.Context, level slog.Level) bool {
	return level >= r.level.Level()
}

// Handle records the line.
func (r *Recorder) Handle(_ context.Context, rec slog.Record) error {
	e := Entry{Level: rec.Level, Message: rec.Message, Attrs: make(map[string]any, rec.NumAttrs()+len(r.attrs))}
	for _, a := range r.attrs {
		add(e.Attrs, "", a)
	}
	rec.Attrs(func(a slog.Attr) bool {
		add(e.Attrs, r.prefix, a)
		return true
	})
	r.shared.mu.Lock()
	defer r.shared.mu.Unlock()
	r.shared.list = append(r.shared.list, e)
	return nil
}

// WithAttrs returns a recorder that adds attrs to every line.
func (r *Recorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	out := *r
	out.attrs = append([]slog.Attr(nil), r.attrs...)
	for _, a := range attrs {
		a.Key = r.prefix + a.Key
		out.attrs = append(out.attrs, a)
	}
	return &out
}

// WithGroup returns a recorder that puts the following attributes under
// name.
func (r *Recorder) WithGroup(name string) slog.Handler {
	if name == "" {
		return r
	}
	out := *r
	out.prefix = r.prefix + name + "."
	return &out
}

// All returns every line recorded so far, oldest first.
func (r *Recorder) All() []Entry {
	r.shared.mu.Lock()
	defer r.shared.mu.Unlock()
	return append([]Entry(nil), r.shared.list...)
}

// Message returns the lines whose message is msg.
func (r *Recorder) Message(msg string) []Entry {
	return r.filter(func(e Entry) bool { return e.Message == msg })
}

// Containing returns the lines whose message contains snippet.
func (r *Recorder) Containing(snippet string) []Entry {
	return r.filter(func(e Entry) bool { return strings.Contains(e.Message, snippet) })
}

// Count returns how many lines have the message msg.
func (r *Recorder) Count(msg string) int { return len(r.Message(msg)) }

func (r *Recorder) filter(keep func(Entry) bool) []Entry {
	var out []Entry
	for _, e := range r.All() {
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}

// StackKeys returns the keys of the attributes that hold a goroutine
// stack trace (text that starts with "goroutine "), sorted: a test that
// requires []string{"stack"} requires one stack, in the stack attribute.
func (e Entry) StackKeys() []string {
	var keys []string
	for k, v := range e.Attrs {
		if s, ok := v.(string); ok && strings.HasPrefix(s, "goroutine ") {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// add records a under prefix, flattening groups and ignoring empty
// attributes, as slog's handlers do.
func add(m map[string]any, prefix string, a slog.Attr) {
	if a.Equal(slog.Attr{}) {
		return
	}
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p += a.Key + "."
		}
		for _, g := range v.Group() {
			add(m, p, g)
		}
		return
	}
	m[prefix+a.Key] = plain(v)
}

func plain(v slog.Value) any {
	switch v.Kind() {
	case slog.KindString:
		return v.String()
	case slog.KindInt64:
		return v.Int64()
	case slog.KindUint64:
		return v.Uint64()
	case slog.KindFloat64:
		return v.Float64()
	case slog.KindBool:
		return v.Bool()
	case slog.KindDuration:
		return v.Duration()
	case slog.KindTime:
		return v.Time().Round(time.Duration(0))
	default:
		if err, ok := v.Any().(error); ok {
			return err.Error()
		}
		return v.Any()
	}
}
