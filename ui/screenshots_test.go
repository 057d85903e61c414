package ui_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/controlrun"
	"github.com/inboxmq/inboxmq/internal/held"
	"github.com/inboxmq/inboxmq/ui"
)

// TestBrowser_Screenshots takes the screenshots of the docs (docs/img) on
// a demo data set: INBOXMQ_UI_SCREENSHOTS=docs/img go test -run
// Screenshots ./ui. It declares the broker queues payments and emails for
// the run and deletes them after, so run it by hand, never in CI.
func TestBrowser_Screenshots(t *testing.T) {
	t.Parallel()
	dir := os.Getenv("INBOXMQ_UI_SCREENSHOTS")
	if dir == "" {
		t.Skip("set INBOXMQ_UI_SCREENSHOTS=docs/img to take the docs' screenshots")
	}
	dir, err := filepath.Abs(filepath.Join("..", dir))
	require.NoError(t, err)
	b := setup(t, false, func(c *ui.Config) {
		c.Queues = []ui.Queue{{Name: "payments"}, {Name: "emails"}}
		c.Refresh = -1
	})
	ctx := t.Context()
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() {
		amqptest.DeleteQueues(t, b.conn, "payments")
		amqptest.DeleteQueues(t, b.conn, "emails")
	})
	for _, q := range []string{"payments", "payments.dlq", "payments.parked", "payments.retry.5s", "payments.retry.30s", "emails", "emails.dlq"} {
		_, err := ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(t, err)
	}
	require.NoError(t, ch.Close())
	for i := range 37 {
		b.pub.Publish("payments", fmt.Appendf(nil, `{"order_id":"order-%d"}`, 2000+i), amqp.Publishing{})
	}
	for range 3 {
		b.pub.Publish("payments.retry.5s", []byte(`{}`), amqp.Publishing{})
	}
	b.pub.Publish("payments.parked", []byte(`{"order_id":"order-1009"}`), amqp.Publishing{Headers: amqp.Table{inboxtype.HeaderIdempotencyKey: "payment:order-1009"}})

	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status, attempts, completed_at, updated_at, first_seen_at)
		SELECT 'payments', 'payment:order-' || g, 'completed', 1, now() - (g - 1099) * interval '1 second', now(), now() - interval '1 hour' FROM generate_series(1100, 2340) g`)
	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status, attempts, completed_at)
		SELECT 'emails', 'email:welcome-' || g, 'completed', 1, now() - g * interval '7 seconds' FROM generate_series(1, 310) g`)
	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status, owner, fence, attempts, lease_until, updated_at) VALUES
		('payments', 'payment:order-1017', 'processing', 'worker-7f9c-2', 2, 1, now() - interval '14 minutes', now() - interval '15 minutes'),
		('payments', 'payment:order-2341', 'processing', 'worker-3a1e-1', 1, 1, now() + interval '20 seconds', now() - interval '10 seconds')`)
	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status, attempts, fence, last_error, last_failed_at, message_id, payload, result) VALUES
		('payments', 'payment:order-1001', 'dead', 5, 1, 'exhausted: gateway: 503 Service Unavailable', now() - interval '40 minutes', '6f1c2a90-order-1001',
		 '{"order_id":"order-1001","cents":1999,"currency":"EUR","customer":"c-311"}', NULL),
		('payments', 'payment:order-1002', 'failed', 3, 1, 'timeout: gateway did not answer within 10s', now() - interval '30 seconds', 'b2e4-order-1002', NULL, NULL)`)
	st := control.NewStore(b.pool)
	require.NoError(t, st.SetConcurrency(ctx, "payments", 4, &control.ChangeOpts{By: "ui:alice@10.1.4.7", Reason: "database contention"}))
	require.NoError(t, st.Pause(ctx, "emails", &control.ChangeOpts{By: "ui:bob@10.1.4.9", Reason: "SMTP provider outage"}))
	require.NoError(t, st.Block(ctx, control.Block{Namespace: "payments", Pattern: "payment:order-1009", Reason: "chargeback dispute", CreatedBy: "ui:alice@10.1.4.7"}))
	for _, p := range []control.Presence{
		{ID: "payment-worker-7f9c", Host: "pay-7f9c", PID: 1, Namespaces: []string{"payments"}, Controls: true},
		{ID: "payment-worker-3a1e", Host: "pay-3a1e", PID: 1, Namespaces: []string{"payments"}, Controls: true},
		{ID: "mailer-0b2d", Host: "mail-0b2d", PID: 1, Namespaces: []string{"emails"}, Controls: false},
	} {
		p.Version = inboxmq.Version
		h := controlrun.NewHeartbeat(b.pool, p, nil)
		require.NoError(t, h.Start(ctx))
		t.Cleanup(func() { _ = h.Stop(context.Background()) })
	}
	hs := held.NewStore(b.pool)
	for i, order := range []string{"order-1001", "order-1012", "order-1015"} {
		dl := held.DeadLetter{Namespace: "payments", Queue: "payments", Key: "customer:c-311", MessageID: "6f1c2a90-" + order,
			IdempotencyKey: "payment:" + order, Copy: &amqp.Publishing{Body: fmt.Appendf(nil, `{"order_id":%q}`, order)}}
		if i == 0 {
			dl.Reason, dl.Error = "exhausted", "gateway: 503 Service Unavailable"
		}
		require.NoError(t, hs.Hold(ctx, dl))
	}
	b.exec(t, `INSERT INTO inboxmq_outbox (message_id, routing_key, body, created_at)
		SELECT 'receipt-' || g, 'receipts', '{}', now() - g * interval '3 seconds' FROM generate_series(1, 5) g`)

	dl := func(id, key, reason string, body string, extra amqp.Table) {
		h := amqp.Table{inboxtype.HeaderError: reason, inboxtype.HeaderAttempt: int32(5), inboxtype.HeaderOriginalQueue: "payments",
			inboxtype.HeaderFirstFailedAt: "2026-12-03T09:12:04Z", inboxtype.HeaderLastFailedAt: "2026-12-03T09:41:37Z"}
		if key != "" {
			h[inboxtype.HeaderIdempotencyKey] = key
		}
		for k, v := range extra {
			h[k] = v
		}
		b.pub.Publish("payments.dlq", []byte(body), amqp.Publishing{MessageId: id, Headers: h, ContentType: "application/json"})
	}
	dl("6f1c2a90-order-1001", "payment:order-1001", "exhausted: gateway: 503 Service Unavailable", `{"order_id":"order-1001","cents":1999,"currency":"EUR","customer":"c-311"}`, nil)
	dl("0c77e1d4-order-1100", "payment:order-1100", "exhausted: gateway: 503 Service Unavailable", `{"order_id":"order-1100","cents":500,"currency":"EUR","customer":"c-12"}`, nil)
	dl("9a0b-bad", "", "decode: invalid character '<' looking for beginning of value", `<script>alert("pwned")</script>`, nil)

	tb := b.newTab(t)
	tb.do(chromedp.EmulateViewport(1280, 760))
	shot := func(name, path string) {
		t.Helper()
		tb.open(path)
		sctx, cancel := context.WithTimeout(tb.ctx, time.Minute)
		defer cancel()
		png, err := chromedp.Run(sctx, chromedp.CaptureScreenshot())
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "console-"+name+".png"), png, 0o644))
	}
	shot("overview", "/")
	tb.login("alice")
	shot("dead-letters", "/dlq?queue=payments")
	shot("held", "/held")
	shot("key", "/inbox/row?ns=payments&key=payment:order-1001")
	shot("claims", "/claims/dry-run?grace=30s")
	shot("controls", "/controls")
}
