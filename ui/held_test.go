package ui_test

import (
	"net/http"
	"net/url"
	"regexp"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/held"
)

// hold holds key of b.queue after the dead letter of message id, or parks
// the message behind the key's head when the key is held already.
func (b *testBundle) hold(t *testing.T, key, id, errText string, body []byte) {
	t.Helper()
	require.NoError(t, held.NewStore(b.pool).Hold(t.Context(), held.DeadLetter{
		Namespace: b.queue, Queue: b.queue, Key: key, MessageID: id, IdempotencyKey: "entry:" + id,
		Reason: "exhausted", Error: errText, Copy: &amqp.Publishing{MessageId: id, Body: body},
	}))
}

// heldRow returns the held keys page's row of key.
func heldRow(t *testing.T, page, key string) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)<tr data-namespace="[^"]*" data-key="` + regexp.QuoteMeta(key) + `">.*?</tr>`).FindString(page)
	require.NotEmpty(t, m, "a row of %s", key)
	return m
}

func TestHeld_ListsKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, false, nil)
	c := b.client(t)
	status, page := c.get("/held")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, "No ordering key is held.")
	require.Contains(t, page, `href="/held" class="on">Held keys</a>`)

	b.hold(t, "acct-<a>", "m-1", "ledger rejects <b>acct-a:2</b>", []byte(`{"seq":1}`))
	b.hold(t, "acct-<a>", "m-2", "", []byte(`{"seq":2}`))
	b.hold(t, "acct-<a>", "m-3", "", []byte(`{"seq":3}`))
	_, page = c.get("/held")
	require.NotContains(t, page, "No ordering key is held.")
	require.NotContains(t, page, "<b>acct-a:2</b>", "the error is escaped")
	row := heldRow(t, page, "acct-&lt;a&gt;")
	for _, want := range []string{
		"<td>" + b.queue + "</td>", "<code>acct-&lt;a&gt;</code>", `<span class="badge bad">held</span>`,
		"m-1", "<code>entry:m-1</code>", "<td>exhausted</td>",
		`<td class="reason">ledger rejects &lt;b&gt;acct-a:2&lt;/b&gt;</td>`,
		`<td class="n">3</td>`, // the head's copy and the two parked behind it
		`href="/dlq?queue=` + url.QueryEscape(b.queue) + `"`,
	} {
		require.Contains(t, row, want)
	}
	require.Contains(t, row, `action="/held/release"`)
	require.Contains(t, row, `action="/held/skip"`)

	// A key of a namespace the console does not show is listed, without
	// the forms.
	b.exec(t, `INSERT INTO inboxmq_held_keys (consumer, ordering_key, queue, exchange, reason) VALUES ('other', 'k-9', 'other', '', 'decode')`)
	_, page = c.get("/held")
	row = heldRow(t, page, "k-9")
	require.Contains(t, row, "not a namespace of this console")
	require.NotContains(t, row, "<form")
}

// A release sends the head's copy to the outbox for its run and marks
// the key releasing; a skip drops the head and sends the next message.
// Both need the operator token, and each is audited and counted.
func TestHeld_ReleaseAndSkip(t *testing.T) {
	t.Parallel()
	b := setup(t, false, nil)
	b.hold(t, "acct-a", "a-1", "ledger rejects acct-a:1", []byte(`{"seq":1}`))
	b.hold(t, "acct-a", "a-2", "", []byte(`{"seq":2}`))
	b.hold(t, "acct-b", "b-1", "ledger rejects acct-b:1", []byte(`{"seq":1}`))
	b.hold(t, "acct-b", "b-2", "", []byte(`{"seq":2}`))
	state := func(key string) string {
		var s string
		require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT state FROM inboxmq_held_keys WHERE ordering_key = $1`, key).Scan(&s))
		return s
	}
	outbox := func(key string) []string {
		rows, err := b.pool.Query(t.Context(), `SELECT convert_from(body, 'UTF8') FROM inboxmq_outbox WHERE routing_key = $1 ORDER BY id`, key)
		require.NoError(t, err)
		var bodies []string
		for rows.Next() {
			var s string
			require.NoError(t, rows.Scan(&s))
			bodies = append(bodies, s)
		}
		require.NoError(t, rows.Err())
		return bodies
	}

	anon := b.client(t)
	for _, p := range []string{"/held/release", "/held/skip"} {
		status, _ := anon.post(p, url.Values{"namespace": {b.queue}, "key": {"acct-a"}})
		require.Equal(t, http.StatusForbidden, status, p)
	}
	c := b.client(t)
	c.login("alice")
	status, _ := c.post("/held/release", url.Values{"namespace": {b.queue}, "key": {"acct-a"}})
	require.Equal(t, http.StatusForbidden, status, "signed in, but the form lacks the CSRF token")
	require.Equal(t, "held", state("acct-a"), "nothing changed")
	require.Empty(t, outbox("acct-a"))
	require.InDelta(t, 2.0, b.actions(t, "held_release", "refused"), 0)

	flash := c.act("/held/release", "namespace", b.queue, "key", "acct-a")
	require.Contains(t, flash, `Released "acct-a" in `+b.queue)
	require.Equal(t, "releasing", state("acct-a"))
	require.Equal(t, []string{`{"seq":1}`}, outbox("acct-a"), "the head's copy runs again first")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inboxmq_held_messages WHERE ordering_key = 'acct-a'`), "the second waits")
	_, page := c.get("/held")
	row := heldRow(t, page, "acct-a")
	require.Contains(t, row, `<span class="badge warn">releasing</span>`)
	require.NotContains(t, row, "<form", "a releasing key has no forms")
	require.Contains(t, c.act("/held/release", "namespace", b.queue, "key", "acct-a"), "Failed: held: the key is already being released")
	require.Contains(t, c.act("/held/skip", "namespace", b.queue, "key", "acct-a"), "Failed: held: the key is already being released")
	require.Equal(t, []string{`{"seq":1}`}, outbox("acct-a"), "a refused release sends nothing")

	flash = c.act("/held/skip", "namespace", b.queue, "key", "acct-b")
	require.Contains(t, flash, `Skipped the head of "acct-b" in `+b.queue)
	require.Equal(t, "releasing", state("acct-b"))
	require.Equal(t, []string{`{"seq":2}`}, outbox("acct-b"), "the head is skipped, the next message runs")
	require.Zero(t, b.count(t, `SELECT count(*) FROM inboxmq_held_messages WHERE ordering_key = 'acct-b'`), "the head's row is dropped")

	require.Contains(t, c.act("/held/release", "namespace", b.queue, "key", "acct-z"), "Failed: held: the key is not held")
	require.Contains(t, c.act("/held/skip", "namespace", "not-a-shown-queue", "key", "acct-b"), "unknown namespace")
	require.Contains(t, c.act("/held/release", "namespace", b.queue), "give the held ordering key")

	require.InDelta(t, 1.0, b.actions(t, "held_release", "ok"), 0)
	require.InDelta(t, 3.0, b.actions(t, "held_release", "error"), 0)
	require.InDelta(t, 1.0, b.actions(t, "held_skip", "ok"), 0)
	var audited []any
	for _, l := range b.logs.Message("ui: audit") {
		if l.Attrs["result"] == "ok" && (l.Attrs["action"] == "held_release" || l.Attrs["action"] == "held_skip") {
			audited = append(audited, l.Attrs["action"], l.Attrs["operator"], l.Attrs["namespace"], l.Attrs["key"])
		}
	}
	require.Equal(t, []any{"held_release", "alice", b.queue, "acct-a", "held_skip", "alice", b.queue, "acct-b"}, audited,
		"the audit lines say who released what")
}
