package ui

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/inboxmq/inboxmq/internal/held"
)

type heldData struct {
	Keys []held.Key
	// Shown holds the namespaces the console shows, whose keys it acts
	// on, and Queues the work queues it shows (for the DLQ links).
	Shown  map[string]bool
	Queues map[string]bool
	Now    time.Time
	Err    string
}

func (heldData) title() string { return "Held keys" }

// heldPage lists the held keys of strict ordered routes, oldest first,
// with the forms that release a key or skip its head.
func (con *Console) heldPage(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	d := heldData{Shown: map[string]bool{}, Queues: map[string]bool{}, Now: time.Now()}
	qs, err := con.queues(ctx)
	if err != nil {
		d.Err = con.redact(err.Error())
	}
	for _, q := range qs {
		d.Shown[q.Namespace], d.Queues[q.Name] = true, true
	}
	lctx, cancel := context.WithTimeout(ctx, con.cfg.QueryTimeout)
	d.Keys, err = con.held.List(lctx, "")
	cancel()
	if err != nil {
		d.Err = con.redact(err.Error())
	}
	con.render(w, r, http.StatusOK, "held", d)
}

// heldKey reads the form's namespace (one the console shows) and
// ordering key.
func (con *Console) heldKey(r *http.Request) (Queue, string, error) {
	q, err := con.namespace(r.Context(), r)
	if err != nil {
		return Queue{}, "", err
	}
	key := r.PostFormValue("key")
	if key == "" {
		return Queue{}, "", errors.New("ui: give the held ordering key")
	}
	return q, key, nil
}

// heldRelease releases a held key (held.Store.Release, as inboxctl
// ordered release does): its head's copy runs again first, then the
// parked messages, one at a time, in order.
func (con *Console) heldRelease(r *http.Request, _ string) actionResult {
	return con.heldAct(r, con.held.Release, func(ns, key string) string {
		return fmt.Sprintf("Released %q in %s: its head runs again first, then its parked messages one at a time, in order.", key, ns)
	})
}

// heldSkip drops a held key's head (its dead letter stays in the DLQ) and
// releases the rest (held.Store.Skip, as inboxctl ordered skip does).
func (con *Console) heldSkip(r *http.Request, _ string) actionResult {
	return con.heldAct(r, con.held.Skip, func(ns, key string) string {
		return fmt.Sprintf("Skipped the head of %q in %s (its dead letter stays in the DLQ): its parked messages run one at a time, in order.", key, ns)
	})
}

func (con *Console) heldAct(r *http.Request, apply func(ctx context.Context, ns, key string) error, done func(ns, key string) string) actionResult {
	res := actionResult{back: "/held"}
	q, key, err := con.heldKey(r)
	if err != nil {
		res.err = err
		return res
	}
	res.attrs = []slog.Attr{slog.String("namespace", q.Namespace), slog.String("key", key)}
	if res.err = apply(r.Context(), q.Namespace, key); res.err == nil {
		res.flash = done(q.Namespace, key) + " They go out through the outbox relay of the running workers; this page shows the progress."
	}
	return res
}
