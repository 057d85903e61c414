package ui

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"

	"github.com/jackc/pgx/v5"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/internal/ops"
)

type inboxData struct {
	Queues    []Queue
	Namespace string
	Key       string
	Prefix    string
	Rows      []ops.KeyRow
	Next      string
	Searched  bool
	Err       string
}

func (inboxData) title() string { return "Inbox" }

// inboxSearch finds keys of a namespace: an exact key goes to its row, a
// prefix lists the matching keys a page at a time.
func (con *Console) inboxSearch(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	qv := r.URL.Query()
	d := inboxData{Namespace: qv.Get("ns"), Key: qv.Get("key"), Prefix: qv.Get("prefix")}
	qs, err := con.queues(ctx)
	if err != nil {
		d.Err = con.redact(err.Error())
	}
	d.Queues = qs
	if d.Namespace == "" && len(qs) > 0 {
		d.Namespace = qs[0].Namespace
	}
	if d.Key != "" {
		http.Redirect(w, r, con.cfg.BasePath+"/inbox/row?ns="+qEsc(d.Namespace)+"&key="+qEsc(d.Key), http.StatusSeeOther)
		return
	}
	if _, ok := qv["prefix"]; ok && d.Namespace != "" {
		d.Searched = true
		s, err := con.inbox(ctx)
		if err == nil {
			err = ops.Bounded(ctx, con.cfg.DB, con.cfg.QueryTimeout, func(tx pgx.Tx) error {
				var err error
				d.Rows, err = ops.SearchKeys(ctx, tx, s.Table(), d.Namespace, d.Prefix, qv.Get("after"), con.cfg.PageSize+1)
				return err
			})
		}
		if err != nil {
			d.Err = con.redact(err.Error())
		}
		if len(d.Rows) > con.cfg.PageSize {
			d.Rows = d.Rows[:con.cfg.PageSize]
			d.Next = d.Rows[len(d.Rows)-1].Key
		}
	}
	con.render(w, r, http.StatusOK, "inbox", d)
}

type rowData struct {
	Namespace string
	Key       string
	Record    *inbox.Record
	Payload   *bodyView
	Result    string
	Steps     []stepView
	Block     *control.Block
	Queue     *Queue
}

type stepView struct{ Name, Result string }

func (d rowData) title() string { return "Key " + d.Key }

func (con *Console) inboxRow(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	d := rowData{Namespace: r.URL.Query().Get("ns"), Key: r.URL.Query().Get("key")}
	s, err := con.inbox(ctx)
	if err != nil {
		con.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	gctx, cancel := context.WithTimeout(ctx, con.cfg.QueryTimeout)
	d.Record, err = s.Get(gctx, d.Namespace, d.Key)
	cancel()
	if errors.Is(err, inbox.ErrNotFound) {
		con.render(w, r, http.StatusNotFound, "row", d)
		return
	}
	if err != nil {
		con.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	err = ops.Bounded(ctx, con.cfg.DB, con.cfg.QueryTimeout, func(tx pgx.Tx) error {
		p, err := ops.StoredPayload(ctx, tx, s.Table(), d.Namespace, d.Key, con.cfg.BodyLimit)
		if err == nil && p.Kept {
			v := viewBody(p.Head, p.Bytes)
			d.Payload = &v
		}
		return err
	})
	if err != nil {
		con.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	if len(d.Record.Result) > 0 {
		d.Result = viewBody(d.Record.Result, len(d.Record.Result)).Text
	}
	for name, res := range d.Record.Steps {
		d.Steps = append(d.Steps, stepView{Name: name, Result: clip(string(compact(res)), 2048)})
	}
	bctx, cancel := context.WithTimeout(ctx, con.cfg.QueryTimeout)
	if b, ok, err := con.controls.Blocked(bctx, d.Namespace, d.Key); err == nil && ok {
		d.Block = &b
	}
	cancel()
	if q, ok := con.queue(ctx, d.Namespace); ok {
		d.Queue = &q
	}
	con.render(w, r, http.StatusOK, "row", d)
}

func compact(b json.RawMessage) []byte {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return b
	}
	return buf.Bytes()
}

func qEsc(s string) string { return url.QueryEscape(s) }
