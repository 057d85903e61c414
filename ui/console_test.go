package ui_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/controlrun"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/ui"
)

func TestNew_RefusesBadConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, false, nil)
	for name, cfg := range map[string]*ui.Config{
		"nil":         nil,
		"no db":       {Token: operatorToken},
		"short token": {DB: b.pool, Token: "short"},
		"bad queue":   {DB: b.pool, Token: operatorToken, Queues: []ui.Queue{{Name: ""}}},
		"bad base":    {DB: b.pool, Token: operatorToken, BasePath: "console"},
	} {
		_, err := ui.New(cfg)
		require.Error(t, err, name)
		require.True(t, strings.HasPrefix(err.Error(), "ui: "), err.Error())
	}
}

func TestOverview(t *testing.T) {
	t.Parallel()
	b := setup(t, true, nil)
	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status, completed_at)
		SELECT $1, 'order:' || g, 'completed', now() FROM generate_series(1, 7) g`, b.queue)
	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status, owner, lease_until, updated_at) VALUES
		($1, 'order:stale', 'processing', 'w-1', now() - interval '1 minute', now() - interval '5 minutes')`, b.queue)
	b.exec(t, `INSERT INTO inboxmq_outbox (message_id, routing_key, body) VALUES ('m-1', 'x', '{}')`)
	require.NoError(t, control.NewStore(b.pool).Pause(t.Context(), b.queue, &control.ChangeOpts{By: "alice", Reason: "incident"}))
	b.deadLetter(t, "d-1", "order:9", "exhausted: boom", []byte(`{"id":"9"}`))

	c := b.client(t)
	status, page := c.get("/")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, `<tr data-queue="`+b.queue+`">`)
	require.Regexp(t, `<td class="n">7</td><td class="n">1</td><td class="n">0</td><td class="n">0</td><td class="n">0</td>`, page, "rows by status")
	require.Contains(t, page, "5m0", "oldest claim age")
	require.Contains(t, page, `<span class="badge bad">1</span>`, "one stale claim")
	require.Contains(t, page, `<span class="badge paused">paused</span>`)
	require.Contains(t, page, "by alice")
	require.Contains(t, page, `?queue=`+url.QueryEscape(b.queue)+`">1</a>`, "DLQ depth")
	require.Contains(t, page, `<td class="n" id="outbox-pending">1</td>`)
	require.Contains(t, page, `<meta http-equiv="refresh" content="10">`)
	require.NotContains(t, page, "guest:guest", "no credential shown")
	require.Contains(t, page, "amqp://guest:xxxxx@")
}

func TestSecurityHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t, false, nil)
	for _, path := range []string{"/", "/login", "/static/style.css"} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, b.srv.URL+path, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		csp := resp.Header.Get("Content-Security-Policy")
		require.Contains(t, csp, "default-src 'none'")
		require.Contains(t, csp, "frame-ancestors 'none'")
		require.NotContains(t, csp, "script-src", "no script is allowed at all")
		require.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"))
		require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
	}
}

func TestInboxSearch(t *testing.T) {
	t.Parallel()
	b := setup(t, false, func(c *ui.Config) { c.PageSize = 2 })
	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status, attempts, fence, owner, last_error, last_failed_at, message_id, payload, result)
		VALUES ($1, 'order:1', 'failed', 3, 2, 'w-1', 'exhausted: gateway <b>down</b>', now(), 'm-1', '{"id":"1","cents":5}', '{"charge":"ch_1"}')`, b.queue)
	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status) SELECT $1, 'order:' || g, 'completed' FROM generate_series(2, 4) g`, b.queue)
	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status) VALUES ($1, 'refund:1', 'completed')`, b.queue)
	c := b.client(t)

	status, loc := c.get("/inbox?ns=" + url.QueryEscape(b.queue) + "&key=order:1")
	require.Equal(t, http.StatusSeeOther, status, loc)
	status, page := c.get("/inbox/row?ns=" + url.QueryEscape(b.queue) + "&key=order:1")
	require.Equal(t, http.StatusOK, status)
	for _, want := range []string{
		`id="status">failed<`, "<dd>3</dd>", "<dd>2</dd>", "<dd>w-1</dd>", "<dd>m-1</dd>",
		"exhausted: gateway &lt;b&gt;down&lt;/b&gt;",
		"&#34;cents&#34;: 5", // the stored payload, pretty-printed
		"&#34;charge&#34;: &#34;ch_1&#34;",
	} {
		require.Contains(t, page, want)
	}
	status, _ = c.get("/inbox/row?ns=" + url.QueryEscape(b.queue) + "&key=order:404")
	require.Equal(t, http.StatusNotFound, status)

	status, page = c.get("/inbox?ns=" + url.QueryEscape(b.queue) + "&prefix=order:")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, ">order:1</a>")
	require.Contains(t, page, ">order:2</a>")
	require.NotContains(t, page, ">order:3</a>", "a page holds PageSize rows")
	require.NotContains(t, page, ">refund:1</a>")
	require.Contains(t, page, "after=order%3a2")
	status, page = c.get("/inbox?ns=" + url.QueryEscape(b.queue) + "&prefix=order:&after=order:2")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, ">order:3</a>")
	require.Contains(t, page, ">order:4</a>")
	require.NotContains(t, page, "Next page")
}

func TestStaleClaims_DryRunThenReconcile(t *testing.T) {
	t.Parallel()
	b := setup(t, false, nil)
	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status, owner, fence, lease_until) VALUES
		($1, 'order:1', 'processing', 'w-gone', 1, now() - interval '10 minutes')`, b.queue)
	c := b.client(t)
	status, page := c.get("/claims")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, ">order:1</a>")
	require.Contains(t, page, "<td>w-gone</td>")

	status, page = c.get("/claims/dry-run?grace=1m")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, "would release: no effect check")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE status = 'processing'`), "a dry run changes nothing")

	status, _ = c.post("/claims/reconcile", url.Values{"grace": {"1m"}})
	require.Equal(t, http.StatusForbidden, status)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE status = 'processing'`))

	c.login("alice")
	flash := c.act("/claims/reconcile", "grace", "1m")
	require.Contains(t, flash, "Reconciled 1 stale claims: 1 released")
	require.Contains(t, flash, "order:1: released")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE key = 'order:1' AND status = 'failed'`))
}

// A state change without the operator token, without the form's CSRF
// token, or from another origin is refused with 403 and changes nothing;
// the refusal is audited and counted.
func TestActions_RefusedWithoutTokenOrCSRF(t *testing.T) {
	t.Parallel()
	b := setup(t, true, nil)
	blocks := func() int { return b.count(t, `SELECT count(*) FROM inboxmq_blocks`) }
	form := func(extra ...string) url.Values {
		v := url.Values{"namespace": {b.queue}, "pattern": {"order:1"}}
		for i := 0; i+1 < len(extra); i += 2 {
			v.Set(extra[i], extra[i+1])
		}
		return v
	}

	anon := b.client(t)
	status, _ := anon.post("/controls/block", form())
	require.Equal(t, http.StatusForbidden, status, "no operator token")
	status, _ = anon.post("/login", url.Values{"operator": {"mallory"}, "token": {"guess-guess-guess-guess"}})
	require.Equal(t, http.StatusForbidden, status, "wrong operator token")
	status, _ = anon.post("/controls/block", form())
	require.Equal(t, http.StatusForbidden, status)

	c := b.client(t)
	c.login("alice")
	status, _ = c.post("/controls/block", form())
	require.Equal(t, http.StatusForbidden, status, "signed in, but the form lacks the CSRF token")
	status, _ = c.post("/controls/block", form("csrf", "not-the-token"))
	require.Equal(t, http.StatusForbidden, status, "a wrong CSRF token")
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.srv.URL+"/controls/block", strings.NewReader(form("csrf", c.csrf).Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, _ := c.do(req)
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "a cross-origin post")
	require.Zero(t, blocks(), "nothing changed")
	for _, p := range []string{"/controls/pause", "/controls/concurrency", "/dlq/replay", "/dlq/purge", "/claims/reconcile", "/controls/unblock", "/held/release", "/held/skip"} {
		status, _ := anon.post(p, url.Values{"namespace": {b.queue}, "queue": {b.queue}, "n": {"1"}, "all": {"1"}, "confirm": {b.dlq}, "key": {"order:1"}})
		require.Equal(t, http.StatusForbidden, status, p)
	}
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM inboxmq_controls`))
	require.GreaterOrEqual(t, b.actions(t, "block", "refused"), 4.0)
	reasons := map[any]int{}
	for _, l := range b.logs.Message("ui: audit") {
		if l.Attrs["result"] == "refused" {
			reasons[l.Attrs["reason"]]++
		}
	}
	require.Equal(t, 2, reasons["missing or wrong form token (CSRF)"], "each refusal is audited")
	require.Equal(t, 1, reasons["cross-origin request"])
	require.GreaterOrEqual(t, reasons["operator token required: sign in first"], 8)
	require.InDelta(t, 1.0, b.actions(t, "login", "refused"), 0)
	require.InDelta(t, 1.0, b.actions(t, "cross_origin", "refused"), 0)

	flash := c.act("/controls/block", "namespace", b.queue, "pattern", "order:1", "reason", "chargeback")
	require.Contains(t, flash, `Blocked "order:1"`)
	require.Equal(t, 1, blocks(), "the same form with both tokens is accepted")
}

// A dead letter's body is hostile input: it is shown as text, escaped,
// and reading it leaves it in the DLQ.
func TestDLQ_BodyEscapedAndKept(t *testing.T) {
	t.Parallel()
	b := setup(t, true, nil)
	b.deadLetter(t, "evil", "order:<script>", "decode: <script>alert(1)</script>", []byte(`<script>alert("pwned")</script>`))
	b.deadLetter(t, "json", "order:2", "exhausted: gateway down", []byte(`{"id":"2","nested":{"a":[1,2]}}`))
	b.deadLetter(t, "json2", "order:3", "exhausted: gateway down again", []byte(`{"id":"3"}`))
	c := b.client(t)
	status, page := c.get("/dlq?queue=" + url.QueryEscape(b.queue))
	require.Equal(t, http.StatusOK, status)
	require.NotContains(t, page, "<script>")
	require.Contains(t, page, `&lt;script&gt;alert(&#34;pwned&#34;)&lt;/script&gt;`)
	require.Contains(t, page, `decode: &lt;script&gt;alert(1)&lt;/script&gt;`)
	require.Contains(t, page, "{\n  &#34;id&#34;: &#34;2&#34;,\n  &#34;nested&#34;: {", "JSON pretty-printed")
	require.Contains(t, page, `data-group="exhausted"`)
	require.Contains(t, page, `data-group="decode"`)
	require.Contains(t, page, `<button type="submit" name="group" value="exhausted: "`)
	require.Equal(t, 3, amqptest.Depth(t, b.conn, b.dlq), "reading removes nothing")
	status, _ = c.get("/dlq?queue=" + url.QueryEscape(b.queue))
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, 3, amqptest.Depth(t, b.conn, b.dlq))
}

func TestDLQ_BodyBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, true, func(c *ui.Config) { c.BodyLimit = 64 })
	b.deadLetter(t, "big", "order:1", "exhausted: x", []byte(`{"id":"1","pad":"`+strings.Repeat("y", 4000)+`"}`))
	status, page := b.client(t).get("/dlq?queue=" + url.QueryEscape(b.queue))
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, "first 64 B shown")
	require.NotContains(t, page, strings.Repeat("y", 100))
}

func TestDLQ_ReplaySelectionGroupAndPurge(t *testing.T) {
	t.Parallel()
	b := setup(t, true, nil)
	for _, m := range [][3]string{{"a", "order:a", "exhausted: x"}, {"b", "order:b", "decode: y"}, {"c", "order:c", "exhausted: z"}, {"d", "order:d", "decode: w"}, {"e", "order:e", "invalid: v"}} {
		b.deadLetter(t, m[0], m[1], m[2], []byte(`{}`))
	}
	c := b.client(t)
	c.login("alice")
	flash := c.act("/dlq/replay", "queue", b.queue, "one", "b")
	require.Contains(t, flash, "Replayed 1 of 5")
	require.Equal(t, 1, amqptest.Depth(t, b.conn, b.queue))
	flash = c.act("/dlq/replay", "queue", b.queue, "id", "a", "id", "d")
	require.Contains(t, flash, "Replayed 2 of 4")
	flash = c.act("/dlq/replay", "queue", b.queue, "group", "exhausted: ")
	require.Contains(t, flash, "Replayed 1 of 2")
	require.Equal(t, 4, amqptest.Depth(t, b.conn, b.queue))
	require.Equal(t, 1, amqptest.Depth(t, b.conn, b.dlq))

	status, page := c.get("/dlq/purge?queue=" + url.QueryEscape(b.queue))
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, "cannot be undone")
	flash = c.act("/dlq/purge", "queue", b.queue, "confirm", "yes")
	require.Contains(t, flash, "purge not confirmed")
	require.Equal(t, 1, amqptest.Depth(t, b.conn, b.dlq), "an unconfirmed purge deletes nothing")
	flash = c.act("/dlq/purge", "queue", b.queue, "confirm", b.dlq)
	require.Contains(t, flash, "Purged 1 messages")
	require.Zero(t, amqptest.Depth(t, b.conn, b.dlq))

	require.InDelta(t, 3.0, b.actions(t, "dlq_replay", "ok"), 0)
	require.InDelta(t, 1.0, b.actions(t, "dlq_purge", "error"), 0)
	lines := b.logs.Message("ui: audit")
	var replayed []any
	for _, l := range lines {
		if l.Attrs["action"] == "dlq_replay" && l.Attrs["selection"] == "2 selected messages" {
			replayed = append(replayed, l.Attrs["operator"], l.Attrs["replayed"], l.Attrs["result"])
		}
	}
	require.Equal(t, []any{"alice", int64(2), "ok"}, replayed, "the audit line says who replayed what")
}

// Replaying a dead letter whose key the inbox completed is absorbed: the
// inbox acks it as a duplicate and the effect stays single.
func TestDLQ_ReplayOfCompletedKeyIsAbsorbed(t *testing.T) {
	t.Parallel()
	b := setup(t, false, nil)
	settled := b.startWorker(t)
	b.pub.Publish(b.queue, []byte(`{"id":"42"}`), amqp.Publishing{MessageId: "first"})
	require.NoError(t, testenv.WaitChan(t, settled, "the first delivery handled"))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:42'`))
	// A copy of the same job dead-lettered earlier (say, by a producer's
	// resend that hit an outage) waits in the DLQ.
	b.deadLetter(t, "copy", "order:42", "exhausted: gateway down", []byte(`{"id":"42"}`))

	c := b.client(t)
	_, page := c.get("/dlq?queue=" + url.QueryEscape(b.queue))
	require.Contains(t, page, `<span class="badge completed">completed</span>`)
	require.Contains(t, page, "replay will be absorbed as a duplicate")
	c.login("alice")
	require.Contains(t, c.act("/dlq/replay", "queue", b.queue, "one", "copy"), "Replayed 1 of 1")

	err := testenv.WaitChan(t, settled, "the replayed copy handled")
	require.True(t, isDuplicate(err), "the inbox absorbs the replay: %v", err)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:42'`), "one effect")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE key = 'order:42' AND status = 'completed'`))
	require.Zero(t, amqptest.Depth(t, b.conn, b.dlq))
}

// Blocking a key in the console parks its next delivery; unblocking
// releases it, and it is processed once.
func TestControls_BlockParksNextDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, false, nil)
	c := b.client(t)
	c.login("alice")
	flash := c.act("/controls/block", "namespace", b.queue, "pattern", "order:7", "reason", "chargeback dispute")
	require.Contains(t, flash, `Blocked "order:7"`)
	var by, reason string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT created_by, reason FROM inboxmq_blocks WHERE pattern = 'order:7'`).Scan(&by, &reason))
	require.Equal(t, "ui:alice@127.0.0.1", by)
	require.Equal(t, "chargeback dispute", reason)

	settled := b.startWorker(t)
	b.pub.Publish(b.queue, []byte(`{"id":"7"}`), amqp.Publishing{MessageId: "m-7"})
	testenv.WaitFor(t, "the delivery parked", func() bool { return amqptest.DepthOrZero(t, b.conn, b.queue+".parked") == 1 })
	require.Zero(t, b.count(t, `SELECT count(*) FROM effects`), "a parked delivery is not processed")
	_, page := c.get("/controls")
	require.Contains(t, page, `<tr data-pattern="order:7">`)
	require.Contains(t, page, "chargeback dispute")
	require.Contains(t, page, "ui:alice@127.0.0.1")

	flash = c.act("/controls/unblock", "namespace", b.queue, "pattern", "order:7")
	require.Contains(t, flash, "Released 1 parked messages")
	require.NoError(t, testenv.WaitChan(t, settled, "the released delivery handled"))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:7'`))
}

func TestControls_PauseResumeConcurrency(t *testing.T) {
	t.Parallel()
	b := setup(t, false, nil)
	c := b.client(t)
	c.login("bob")
	type row struct {
		paused bool
		conc   int
		by     string
		reason *string
	}
	get := func() row {
		var r row
		require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT paused, concurrency, updated_by, reason FROM inboxmq_controls WHERE consumer = $1`, b.queue).
			Scan(&r.paused, &r.conc, &r.by, &r.reason))
		return r
	}
	require.Contains(t, c.act("/controls/pause", "namespace", b.queue, "reason", "gateway outage"), "Paused")
	r := get()
	require.True(t, r.paused)
	require.Equal(t, "ui:bob@127.0.0.1", r.by)
	require.Equal(t, "gateway outage", *r.reason)
	_, page := c.get("/controls")
	require.Contains(t, page, `<span class="badge paused">paused</span>`)
	require.Contains(t, page, "gateway outage")

	require.Contains(t, c.act("/controls/concurrency", "namespace", b.queue, "n", "3"), "Limited")
	require.Equal(t, 3, get().conc)
	require.Contains(t, c.act("/controls/concurrency", "namespace", b.queue, "n", "-1"), "Failed")
	require.Equal(t, 3, get().conc, "a bad value changes nothing")
	require.Contains(t, c.act("/controls/resume", "namespace", b.queue), "Resumed")
	require.False(t, get().paused)
	require.Contains(t, c.act("/controls/pause", "namespace", "not-a-shown-queue"), "unknown namespace")
	require.InDelta(t, 1.0, b.actions(t, "pause", "error"), 0)

	// A worker's breaker shows with the controls.
	_, page = c.get("/controls")
	require.Contains(t, page, "No worker publishes a breaker.")
	b.exec(t, `INSERT INTO inboxmq_breakers (consumer, downstream, worker, state) VALUES ($1, 'gateway', 'w1', 'open')`, b.queue)
	_, page = c.get("/controls")
	require.Contains(t, page, `data-downstream="gateway"`)
	require.Contains(t, page, `<span class="badge bad">open</span>`)
}

// A pause says how many live workers obey it and warns of those that
// ignore it; the controls page and the overview show the count per
// consumer and the workers' presence rows.
func TestControls_ShowWhoObeys(t *testing.T) {
	t.Parallel()
	b := setup(t, true, nil)
	for _, p := range []control.Presence{
		{ID: "w-on", Host: "host-a", PID: 7, Namespaces: []string{b.queue}, Version: "0.1.0", Controls: true},
		{ID: "w-off", Host: "host-b", PID: 8, Namespaces: []string{b.queue}, Version: "0.1.0", Controls: false},
	} {
		h := controlrun.NewHeartbeat(b.pool, p, nil)
		require.NoError(t, h.Start(t.Context()))
		t.Cleanup(func() { require.NoError(t, h.Stop(context.Background())) })
	}
	c := b.client(t)
	c.login("bob")

	flash := c.act("/controls/pause", "namespace", b.queue, "reason", "incident")
	require.Contains(t, flash, "Paused "+b.queue+": 1 live worker obeys")
	require.Contains(t, flash, "Warning: 1 live worker serves "+b.queue+" with controls off (w-off) and ignores the change")
	flash = c.act("/controls/concurrency", "namespace", b.queue, "n", "2")
	require.Contains(t, flash, "Limited "+b.queue+" to 2 concurrent deliveries per worker: 1 live worker obeys")

	_, page := c.get("/controls")
	require.Regexp(t, `(?s)<tr data-namespace="`+regexp.QuoteMeta(b.queue)+`">.*?1 live worker obeys.*?</tr>`, page)
	require.Regexp(t, `(?s)<tr data-worker="w-on">.*?host-a.*?on.*?live.*?</tr>`, page)
	require.Regexp(t, `(?s)<tr data-worker="w-off">.*?host-b.*?off.*?live.*?</tr>`, page)

	_, page = c.get("/")
	require.Regexp(t, `(?s)<tr data-queue="`+regexp.QuoteMeta(b.queue)+`">.*?1 live worker obeys.*?</tr>`, page)
	require.Contains(t, page, `<tr data-worker="w-on">`)
	require.Contains(t, page, "2 live workers (1 with controls off), 0 stale, 0 stopped")
}

func TestLogin_RedirectStaysInside(t *testing.T) {
	t.Parallel()
	b := setup(t, false, func(c *ui.Config) { c.BasePath = "/console" })
	mux := http.NewServeMux()
	mux.Handle("/console/", http.StripPrefix("/console", b.con))
	srv := newServer(t, mux)
	c := b.client(t)
	c.base = srv
	for next, want := range map[string]string{
		"/console/dlq":         "/console/dlq",
		"//evil.example/x":     "/console/",
		"https://evil.example": "/console/",
		"/elsewhere":           "/console/",
	} {
		status, loc := c.post("/console/login", url.Values{"operator": {"a"}, "token": {operatorToken}, "next": {next}})
		require.Equal(t, http.StatusSeeOther, status)
		require.Equal(t, want, loc, next)
	}
	status, page := c.get("/console/")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, `href="/console/static/style.css"`)
}

func TestSessionExpires(t *testing.T) {
	t.Parallel()
	b := setup(t, false, func(c *ui.Config) { c.SessionTTL = time.Millisecond })
	c := b.client(t)
	status, _ := c.post("/login", url.Values{"operator": {"a"}, "token": {operatorToken}})
	require.Equal(t, http.StatusSeeOther, status)
	testenv.WaitFor(t, "the session expired", func() bool {
		_, page := c.get("/")
		return strings.Contains(page, "sign in to act")
	})
}

func TestDLQ_ReplayAllAndLogout(t *testing.T) {
	t.Parallel()
	b := setup(t, true, nil)
	for _, id := range []string{"a", "b", "c"} {
		b.deadLetter(t, id, "", "expired (broker)", []byte(`{}`))
	}
	c := b.client(t)
	c.login("alice")
	require.Contains(t, c.act("/dlq/replay", "queue", b.queue), "nothing selected")
	require.Equal(t, 3, amqptest.Depth(t, b.conn, b.dlq))
	require.Contains(t, c.act("/dlq/replay", "queue", b.queue, "all", "1"), "Replayed 3 of 3")
	require.Equal(t, 3, amqptest.Depth(t, b.conn, b.queue))

	status, _ := c.post("/logout", c.form())
	require.Equal(t, http.StatusSeeOther, status)
	status, _ = c.post("/dlq/replay", c.form("queue", b.queue, "all", "1"))
	require.Equal(t, http.StatusForbidden, status, "a signed-out session acts no more")
}

func TestControls_UnblockKeepsParked(t *testing.T) {
	t.Parallel()
	b := setup(t, true, nil)
	require.NoError(t, control.NewStore(b.pool).Block(t.Context(), control.Block{Namespace: b.queue, Pattern: "tenant:9:", Prefix: true}))
	parked := b.queue + ".parked"
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(parked, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.Close())
	b.pub.Publish(parked, []byte(`{}`), amqp.Publishing{Headers: amqp.Table{"x-idempotency-key": "tenant:9:1"}})
	c := b.client(t)
	c.login("alice")
	_, page := c.get("/controls")
	require.Contains(t, page, `<tr data-pattern="tenant:9:">`)
	flash := c.act("/controls/unblock", "namespace", b.queue, "pattern", "tenant:9:", "prefix", "1", "keep", "1")
	require.Contains(t, flash, `Unblocked "tenant:9:"`)
	require.NotContains(t, flash, "Released")
	require.Equal(t, 1, amqptest.Depth(t, b.conn, parked), "kept parked")
	require.Zero(t, b.count(t, `SELECT count(*) FROM inboxmq_blocks`))
	require.Contains(t, c.act("/controls/unblock", "namespace", b.queue, "pattern", "tenant:9:", "prefix", "1"), "was not blocked")
	require.Zero(t, amqptest.DepthOrZero(t, b.conn, parked), "a second unblock releases what the first kept")
	require.Equal(t, 1, amqptest.Depth(t, b.conn, b.queue))
}

// Without configured queues the console shows the inbox's consumers; a
// broker it cannot reach is reported on the page, without its password.
func TestOverview_DiscoveredQueuesAndBrokerDown(t *testing.T) {
	t.Parallel()
	b := setup(t, false, func(c *ui.Config) {
		c.Queues = nil
		c.AMQPURL = "amqp://ops:s3cr3t-pw@127.0.0.1:1/"
	})
	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status) VALUES ('emails', 'e:1', 'completed'), ('payments', 'p:1', 'failed')`)
	c := b.client(t)
	status, page := c.get("/")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, `<tr data-queue="emails">`)
	require.Contains(t, page, `<tr data-queue="payments">`)
	require.Contains(t, page, "ui: broker: connect to amqp://ops:xxxxx@127.0.0.1:1/")
	require.NotContains(t, page, "s3cr3t-pw")
	status, page = c.get("/dlq?queue=payments")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, `<div class="error">ui: broker`)
	require.NotContains(t, page, "s3cr3t-pw")
	status, _ = c.get("/dlq?queue=nosuch")
	require.Equal(t, http.StatusNotFound, status)
}
