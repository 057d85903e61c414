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
	"github.com/inboxmq/inboxmq/internal/ops"
)

type controlsData struct {
	Queues   []Queue
	Controls []control.Control
	Blocks   []control.Block
	Parked   map[string]int
	// Breakers are the circuit breakers' states the workers published.
	Breakers []control.BreakerState
	Err      string
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
			names = append(names, control.ParkedQueueName(q.Name))
		}
		if depths, err := ops.Depths(conn, names); err == nil {
			for i, dd := range depths {
				d.Parked[qs[i].Namespace] = dd.Messages
			}
		}
	}
	con.render(w, r, http.StatusOK, "controls", d)
}

// namespace reads the form's consumer, which must be one the console
// shows.
func (con *Console) namespace(ctx context.Context, r *http.Request) (Queue, error) {
	name := r.PostFormValue("consumer")
	if q, ok := con.queue(ctx, name); ok {
		return q, nil
	}
	return Queue{}, fmt.Errorf("ui: unknown consumer %q", name)
}

func (con *Console) change(r *http.Request, actor string, verb string, apply func(ctx context.Context, name string, o *control.ChangeOpts) error) actionResult {
	res := actionResult{back: "/controls"}
	q, err := con.namespace(r.Context(), r)
	if err != nil {
		res.err = err
		return res
	}
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	res.attrs = []slog.Attr{slog.String("consumer", q.Namespace), slog.String("reason", reason)}
	if res.err = apply(r.Context(), q.Namespace, &control.ChangeOpts{By: actor, Reason: reason}); res.err == nil {
		res.flash = verb + " " + q.Namespace + "; workers apply it within 2 seconds."
	}
	return res
}

func (con *Console) pause(r *http.Request, actor string) actionResult {
	return con.change(r, actor, "Paused", con.controls.Pause)
}

func (con *Console) resume(r *http.Request, actor string) actionResult {
	return con.change(r, actor, "Resumed", con.controls.Resume)
}

func (con *Console) concurrency(r *http.Request, actor string) actionResult {
	n, err := strconv.Atoi(strings.TrimSpace(r.PostFormValue("n")))
	if err != nil || n < 0 {
		return actionResult{back: "/controls", err: fmt.Errorf("ui: concurrency %q: want 0 (configured) or a positive number", r.PostFormValue("n"))}
	}
	res := con.change(r, actor, "Set the concurrency of", func(ctx context.Context, name string, o *control.ChangeOpts) error {
		return con.controls.SetConcurrency(ctx, name, n, o)
	})
	res.attrs = append(res.attrs, slog.Int("concurrency", n))
	if res.err == nil && n == 0 {
		res.flash = "Restored the configured concurrency of " + r.PostFormValue("consumer") + "."
	} else if res.err == nil {
		res.flash = fmt.Sprintf("Limited %s to %d concurrent deliveries per worker.", r.PostFormValue("consumer"), n)
	}
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
	b := control.Block{Consumer: q.Namespace, Pattern: p, Prefix: isPrefix, Reason: strings.TrimSpace(r.PostFormValue("reason")), CreatedBy: actor}
	res.attrs = []slog.Attr{slog.String("consumer", b.Consumer), slog.String("pattern", p), slog.Bool("prefix", isPrefix), slog.String("reason", b.Reason)}
	if res.err = con.controls.Block(r.Context(), b); res.err == nil {
		res.flash = fmt.Sprintf("Blocked %q for %s: its deliveries are parked in %s within 2 seconds.", p, q.Namespace, control.ParkedQueueName(q.Name))
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
	res.attrs = []slog.Attr{slog.String("consumer", q.Namespace), slog.String("pattern", p), slog.Bool("prefix", isPrefix), slog.Bool("release", release)}
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
