package ui

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/ops"
)

type controlsData struct {
	Queues   []Queue
	Controls []control.Control
	Blocks   []control.Block
	Parked   map[string]int
	// Breakers are the circuit breakers' states the workers published.
	Breakers []control.BreakerState
	// Reach is, per namespace, who obeys a change (nil when the workers
	// cannot be read).
	Reach   map[string]ops.Reach
	Workers workersView
	Err     string
}

// workersView is the workers' presence rows as a page shows them.
type workersView struct {
	Workers []control.Presence
	Summary string
	Err     string
}

// workers reads the presence rows, bounded by the query timeout.
func (con *Console) workers(ctx context.Context) workersView {
	ctx, cancel := context.WithTimeout(ctx, con.cfg.QueryTimeout)
	defer cancel()
	ws, err := con.controls.Workers(ctx)
	if err != nil {
		return workersView{Err: con.redact(err.Error())}
	}
	return workersView{Workers: ws, Summary: ops.WorkersSummary(ws)}
}

// reaches is who obeys a change of each queue's namespace (nil without
// the presence rows).
func reaches(qs []Queue, wv workersView, snap *control.Snapshot) map[string]ops.Reach {
	if wv.Err != "" {
		return nil
	}
	out := make(map[string]ops.Reach, len(qs))
	for _, q := range qs {
		out[q.Namespace] = ops.NewReach(q.Namespace, wv.Workers, snap)
	}
	return out
}

func (controlsData) title() string { return "Controls" }

// controlsPage shows what is in force (pauses, limits, blocks, since when
// and by whom) and the forms that change it.
func (con *Console) controlsPage(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var d controlsData
	qs, err := con.queues(ctx)
	if err != nil {
		d.Err = con.redact(err.Error())
	}
	d.Queues = qs
	snap, err := con.snapshot(ctx)
	if err != nil {
		d.Err = con.redact(err.Error())
	} else {
		d.Controls, d.Blocks = snap.Controls, snap.Blocks
	}
	d.Workers = con.workers(ctx)
	d.Reach = reaches(qs, d.Workers, snap)
	bctx, cancel := context.WithTimeout(ctx, con.cfg.QueryTimeout)
	d.Breakers, err = con.controls.Breakers(bctx, "")
	cancel()
	if err != nil {
		d.Err = con.redact(err.Error())
	}
	if conn, err := con.broker(); err == nil {
		d.Parked = map[string]int{}
		names := make([]string, 0, len(qs))
		for _, q := range qs {
			names = append(names, inboxtype.ParkedQueue(q.Name))
		}
		if depths, err := ops.Depths(conn, names); err == nil {
			for i, dd := range depths {
				d.Parked[qs[i].Namespace] = dd.Messages
			}
		}
	}
	con.render(w, r, http.StatusOK, "controls", d)
}

// namespace reads the form's namespace, which must be one the console
// shows.
func (con *Console) namespace(ctx context.Context, r *http.Request) (Queue, error) {
	name := r.PostFormValue("namespace")
	if q, ok := con.queue(ctx, name); ok {
		return q, nil
	}
	return Queue{}, fmt.Errorf("ui: unknown namespace %q", name)
}

// change applies a change of the form's namespace; done words the flash
// of a success, to which the count of the workers that obey is added.
func (con *Console) change(r *http.Request, actor string, done func(ns string) string, apply func(ctx context.Context, name string, o *control.ChangeOpts) error) actionResult {
	res := actionResult{back: "/controls"}
	q, err := con.namespace(r.Context(), r)
	if err != nil {
		res.err = err
		return res
	}
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	res.attrs = []slog.Attr{slog.String("namespace", q.Namespace), slog.String("reason", reason)}
	if res.err = apply(r.Context(), q.Namespace, &control.ChangeOpts{By: actor, Reason: reason}); res.err == nil {
		res.flash = done(q.Namespace) + con.obeyNote(r.Context(), q.Namespace)
	}
	return res
}

// obeyNote says who obeys a change of ns, as inboxctl does: ": 2 live
// workers obey; they apply it within 2 seconds.", and the warning when
// none does or some ignore it.
func (con *Console) obeyNote(ctx context.Context, ns string) string {
	ctx, cancel := context.WithTimeout(ctx, con.cfg.QueryTimeout)
	defer cancel()
	reach, err := ops.ReachOf(ctx, con.controls, ns)
	if err != nil {
		return "; workers apply it within 2 seconds (which workers obey is unknown: " + con.redact(err.Error()) + ")."
	}
	note := ": " + reach.Summary()
	if len(reach.Obeying) > 0 {
		note += "; they apply it within 2 seconds."
	} else {
		note += "."
	}
	if w := reach.Warning(); w != "" {
		note += " Warning: " + w + "."
	}
	return note
}

func (con *Console) pause(r *http.Request, actor string) actionResult {
	return con.change(r, actor, func(ns string) string { return "Paused " + ns }, con.controls.Pause)
}

func (con *Console) resume(r *http.Request, actor string) actionResult {
	return con.change(r, actor, func(ns string) string { return "Resumed " + ns }, con.controls.Resume)
}

func (con *Console) concurrency(r *http.Request, actor string) actionResult {
	n, err := strconv.Atoi(strings.TrimSpace(r.PostFormValue("n")))
	if err != nil || n < 0 {
		return actionResult{back: "/controls", err: fmt.Errorf("ui: concurrency %q: want 0 (configured) or a positive number", r.PostFormValue("n"))}
	}
	res := con.change(r, actor, func(ns string) string {
		if n == 0 {
			return "Restored the configured concurrency of " + ns
		}
		return fmt.Sprintf("Limited %s to %d concurrent deliveries per worker", ns, n)
	}, func(ctx context.Context, name string, o *control.ChangeOpts) error {
		return con.controls.SetConcurrency(ctx, name, n, o)
	})
	res.attrs = append(res.attrs, slog.Int("concurrency", n))
	return res
}

// pattern reads the form's key or prefix.
func pattern(r *http.Request) (string, bool, error) {
	p := r.PostFormValue("pattern")
	if p == "" {
		return "", false, errors.New("ui: give a key or a prefix")
	}
	return p, r.PostFormValue("prefix") != "", nil
}

func (con *Console) block(r *http.Request, actor string) actionResult {
	res := actionResult{back: "/controls"}
	q, err := con.namespace(r.Context(), r)
	if err != nil {
		res.err = err
		return res
	}
	p, isPrefix, err := pattern(r)
	if err != nil {
		res.err = err
		return res
	}
	b := control.Block{Namespace: q.Namespace, Pattern: p, Prefix: isPrefix, Reason: strings.TrimSpace(r.PostFormValue("reason")), CreatedBy: actor}
	res.attrs = []slog.Attr{slog.String("namespace", b.Namespace), slog.String("pattern", p), slog.Bool("prefix", isPrefix), slog.String("reason", b.Reason)}
	if res.err = con.controls.Block(r.Context(), b); res.err == nil {
		res.flash = fmt.Sprintf("Blocked %q for %s (its deliveries are parked in %s)", p, q.Namespace, inboxtype.ParkedQueue(q.Name)) +
			con.obeyNote(r.Context(), q.Namespace)
	}
	return res
}

// unblock removes a block and releases its parked messages (ops.Unblock,
// as inboxctl unblock does).
func (con *Console) unblock(r *http.Request, actor string) actionResult {
	res := actionResult{back: "/controls"}
	q, err := con.namespace(r.Context(), r)
	if err != nil {
		res.err = err
		return res
	}
	p, isPrefix, err := pattern(r)
	if err != nil {
		res.err = err
		return res
	}
	release := r.PostFormValue("keep") == ""
	res.attrs = []slog.Attr{slog.String("namespace", q.Namespace), slog.String("pattern", p), slog.Bool("prefix", isPrefix), slog.Bool("release", release)}
	conn, err := con.broker()
	if release && err != nil {
		res.err = err
		return res
	}
	if !release {
		conn = nil
	}
	ur, err := ops.Unblock(r.Context(), con.controls, conn, q.Namespace, p, isPrefix, q.Name)
	res.attrs = append(res.attrs, slog.Bool("removed", ur.Removed), slog.Int("released", ur.Released))
	if res.err = err; err != nil {
		return res
	}
	if !ur.Removed {
		res.flash = fmt.Sprintf("%q was not blocked for %s.", p, q.Namespace)
	} else {
		res.flash = fmt.Sprintf("Unblocked %q for %s.", p, q.Namespace)
	}
	if release {
		res.flash += fmt.Sprintf(" Released %d parked messages to %s.", ur.Released, q.Name)
	}
	return res
}
