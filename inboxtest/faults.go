package inboxtest

import (
	"context"
	"errors"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrInjectedCommitFailure is the cause with which [Faults] fails a COMMIT:
// the business writes were made, and then the transaction never committed,
// as when the worker crashes or the connection drops at that moment.
var ErrInjectedCommitFailure = errors.New("inboxtest: injected failure before COMMIT")

// Faults injects failures into the database calls of the handler under
// test. Install it on the pool that the handler's inbox store uses (see
// [Faults.Instrument]) and set [Subject].Faults; it only ever acts on calls
// made under a context the harness tagged, so the same pool can serve other
// work. The zero value is ready to use; it does nothing until a scenario
// arms it.
type Faults struct {
	mu    sync.Mutex
	rules map[uint64]*rule
	next  uint64
	inner pgx.QueryTracer
}

type faultAction int

const (
	actionFail faultAction = iota
	actionPause
)

// rule acts on the nth COMMIT made under one tagged context.
type rule struct {
	nth     int
	action  faultAction
	commits int
	fired   chan struct{} // closed when the rule fires
	started chan struct{} // closed at the first query under the tag
	seen    bool
	release chan struct{} // closed to let a paused COMMIT go on
	once    sync.Once
}

type tagKey struct{}

// Instrument installs f as cfg's query tracer, keeping a tracer already set
// (it is called as well). Call it before pgxpool.NewWithConfig.
func (f *Faults) Instrument(cfg *pgxpool.Config) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cfg.ConnConfig.Tracer != nil {
		if qt, ok := cfg.ConnConfig.Tracer.(pgx.QueryTracer); ok && qt != f {
			f.inner = qt
		}
	}
	cfg.ConnConfig.Tracer = f
}

// arm registers a rule and returns a context tagged with it.
func (f *Faults) arm(ctx context.Context, nth int, action faultAction) (context.Context, *rule) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rules == nil {
		f.rules = make(map[uint64]*rule)
	}
	f.next++
	r := &rule{nth: nth, action: action, fired: make(chan struct{}), started: make(chan struct{}), release: make(chan struct{})}
	f.rules[f.next] = r
	return context.WithValue(ctx, tagKey{}, f.next), r
}

// disarm removes the rule of a tagged context (and releases a pause).
func (f *Faults) disarm(ctx context.Context) {
	id, ok := ctx.Value(tagKey{}).(uint64)
	if !ok {
		return
	}
	f.mu.Lock()
	r := f.rules[id]
	delete(f.rules, id)
	f.mu.Unlock()
	if r != nil {
		r.once.Do(func() { close(r.release) })
	}
}

func (r *rule) hasFired() bool {
	select {
	case <-r.fired:
		return true
	default:
		return false
	}
}

// TraceQueryStart implements pgx.QueryTracer: it fails or pauses the armed
// COMMIT of a tagged context.
func (f *Faults) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	f.mu.Lock()
	inner := f.inner
	var r *rule
	if id, ok := ctx.Value(tagKey{}).(uint64); ok && f.rules[id] != nil && !f.rules[id].seen {
		f.rules[id].seen = true
		close(f.rules[id].started)
	}
	if id, ok := ctx.Value(tagKey{}).(uint64); ok && strings.EqualFold(strings.TrimSpace(data.SQL), "commit") {
		if r = f.rules[id]; r != nil {
			r.commits++
			if r.commits != r.nth {
				r = nil
			}
		}
	}
	f.mu.Unlock()
	if inner != nil {
		ctx = inner.TraceQueryStart(ctx, conn, data)
	}
	if r == nil {
		return ctx
	}
	close(r.fired)
	switch r.action {
	case actionPause:
		select {
		case <-r.release:
		case <-ctx.Done():
		}
		return ctx
	default:
		// An already-cancelled context: pgx does not send the COMMIT, closes
		// the connection, and PostgreSQL rolls the transaction back.
		cctx, cancel := context.WithCancelCause(ctx)
		cancel(ErrInjectedCommitFailure)
		return cctx
	}
}

// TraceQueryEnd implements pgx.QueryTracer.
func (f *Faults) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	f.mu.Lock()
	inner := f.inner
	f.mu.Unlock()
	if inner != nil {
		inner.TraceQueryEnd(ctx, conn, data)
	}
}
