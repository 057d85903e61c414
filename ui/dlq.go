package ui

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/ops"
)

// letterView is one dead letter as the page shows it.
type letterView struct {
	ops.DeadLetter
	Body        bodyView
	Headers     []headerLine
	InboxStatus string
	Absorbed    bool
}

type groupView struct {
	Name    string
	Filter  string
	Letters []letterView
}

type dlqData struct {
	Queues   []Queue
	Queue    Queue
	Messages int
	Shown    int
	Groups   []groupView
	Err      string
}

func (d dlqData) title() string { return "Dead letters" }

// pickQueue returns the queue named by the query (or the first).
func (con *Console) pickQueue(ctx context.Context, name string) ([]Queue, Queue, error) {
	qs, err := con.queues(ctx)
	if err != nil {
		return nil, Queue{}, err
	}
	if len(qs) == 0 {
		return nil, Queue{}, errors.New("ui: no queues: configure Queues or let the inbox name its namespaces")
	}
	if name == "" {
		return qs, qs[0], nil
	}
	for _, q := range qs {
		if q.Name == name {
			return qs, q, nil
		}
	}
	return qs, Queue{}, fmt.Errorf("ui: unknown queue %q", name)
}

// dlq shows the dead letters of a queue grouped by reason, read without
// removing them (ops.PeekQueue), with each key's inbox status: a key
// already completed is acked as a duplicate when replayed.
func (con *Console) dlq(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	qs, q, err := con.pickQueue(ctx, r.URL.Query().Get("queue"))
	if err != nil {
		con.fail(w, r, http.StatusNotFound, err)
		return
	}
	d := dlqData{Queues: qs, Queue: q}
	conn, err := con.broker()
	var peek *ops.Peek
	if err == nil {
		peek, err = ops.PeekQueue(conn, q.DeadLetterQueue, con.cfg.PeekLimit, con.cfg.BodyLimit)
	}
	if err != nil {
		d.Err = con.redact(err.Error())
		con.render(w, r, http.StatusOK, "dlq", d)
		return
	}
	d.Messages, d.Shown = peek.Messages, len(peek.DeadLetters)
	keys := make([]string, 0, len(peek.DeadLetters))
	for _, l := range peek.DeadLetters {
		if l.Key != "" {
			keys = append(keys, l.Key)
		}
	}
	statuses := map[string]string{}
	if s, err := con.inbox(ctx); err == nil {
		err = ops.Bounded(ctx, con.cfg.DB, con.cfg.QueryTimeout, func(tx pgx.Tx) error {
			var err error
			statuses, err = ops.KeyStatuses(ctx, tx, s.Table(), q.Namespace, keys)
			return err
		})
		if err != nil {
			d.Err = con.redact(err.Error())
		}
	}
	reasons := make([]string, 0, len(peek.DeadLetters))
	for _, l := range peek.DeadLetters {
		reasons = append(reasons, l.Error)
	}
	byGroup := map[string]int{}
	for _, l := range peek.DeadLetters {
		g := l.Group()
		i, ok := byGroup[g]
		if !ok {
			i = len(d.Groups)
			byGroup[g] = i
			d.Groups = append(d.Groups, groupView{Name: g, Filter: ops.GroupFilter(g, reasons)})
		}
		st := statuses[l.Key]
		d.Groups[i].Letters = append(d.Groups[i].Letters, letterView{
			DeadLetter: l, Body: viewBody(l.Body, l.Bytes), Headers: headerLines(l.Headers),
			InboxStatus: st, Absorbed: st == inbox.RecordCompleted,
		})
	}
	con.render(w, r, http.StatusOK, "dlq", d)
}

// dlqReplay replays one dead letter ("one"), a selection ("id"), a group
// ("group") or every one ("all") through consumer.ReplayDLQ.
func (con *Console) dlqReplay(r *http.Request, actor string) actionResult {
	ctx := r.Context()
	res := actionResult{back: "/dlq"}
	_, q, err := con.pickQueue(ctx, r.PostFormValue("queue"))
	if err != nil {
		res.err = err
		return res
	}
	res.back = "/dlq?queue=" + qEsc(q.Name)
	opts := &consumer.ReplayOpts{DeadLetterQueue: q.DeadLetterQueue}
	var what string
	switch {
	case r.PostFormValue("one") != "":
		opts.MessageIDs = []string{r.PostFormValue("one")}
		what = "message " + r.PostFormValue("one")
	case r.PostFormValue("all") != "":
		what = "every dead letter"
	case r.PostForm.Has("group"):
		opts.Reason = r.PostFormValue("group")
		what = fmt.Sprintf("group %q", opts.Reason)
	default:
		ids := slices.DeleteFunc(r.PostForm["id"], func(s string) bool { return s == "" })
		if len(ids) == 0 {
			res.err = errors.New("ui: nothing selected to replay")
			return res
		}
		opts.MessageIDs = ids
		what = fmt.Sprintf("%d selected messages", len(ids))
	}
	res.attrs = []slog.Attr{slog.String("queue", q.Name), slog.String("selection", what), slog.Any("message_ids", opts.MessageIDs), slog.String("reason", opts.Reason)}
	conn, err := con.broker()
	if err != nil {
		res.err = err
		return res
	}
	rr, err := consumer.ReplayDLQ(ctx, conn, q.Name, opts)
	res.attrs = append(res.attrs, slog.Int("replayed", rr.Replayed), slog.Int("refused", rr.Refused), slog.Int("kept", rr.Kept))
	if err != nil {
		res.err = err
		return res
	}
	res.flash = fmt.Sprintf("Replayed %d of %d scanned (%s) to %s; %d refused (replayed too often), %d kept. Keys already completed are acked as duplicates by the inbox.",
		rr.Replayed, rr.Scanned, what, q.Name, rr.Refused, rr.Kept)
	return res
}

type purgeData struct {
	Queue    Queue
	Messages int
	Err      string
}

func (purgeData) title() string { return "Purge dead letters" }

func (con *Console) dlqPurgePage(w http.ResponseWriter, r *http.Request) {
	_, q, err := con.pickQueue(r.Context(), r.URL.Query().Get("queue"))
	if err != nil {
		con.fail(w, r, http.StatusNotFound, err)
		return
	}
	d := purgeData{Queue: q}
	conn, err := con.broker()
	if err == nil {
		var depths []ops.QueueDepth
		depths, err = ops.Depths(conn, []string{q.DeadLetterQueue})
		if err == nil {
			d.Messages = depths[0].Messages
		}
	}
	if err != nil {
		d.Err = con.redact(err.Error())
	}
	con.render(w, r, http.StatusOK, "purge", d)
}

// dlqPurge deletes every dead letter of a queue once the operator typed
// the DLQ's name.
func (con *Console) dlqPurge(r *http.Request, actor string) actionResult {
	res := actionResult{back: "/dlq"}
	_, q, err := con.pickQueue(r.Context(), r.PostFormValue("queue"))
	if err != nil {
		res.err = err
		return res
	}
	res.back = "/dlq?queue=" + qEsc(q.Name)
	res.attrs = []slog.Attr{slog.String("queue", q.DeadLetterQueue)}
	if r.PostFormValue("confirm") != q.DeadLetterQueue {
		res.err = fmt.Errorf("ui: purge not confirmed: type %q", q.DeadLetterQueue)
		res.back = "/dlq/purge?queue=" + qEsc(q.Name)
		return res
	}
	conn, err := con.broker()
	if err != nil {
		res.err = err
		return res
	}
	n, err := ops.PurgeQueue(conn, q.DeadLetterQueue)
	res.attrs = append(res.attrs, slog.Int("purged", n))
	if err != nil {
		res.err = err
		return res
	}
	res.flash = fmt.Sprintf("Purged %d messages from %s.", n, q.DeadLetterQueue)
	return res
}
