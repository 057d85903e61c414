package inboxmq_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// oddResult is a result in no normal form (keys out of order, two
// spaces): any re-encoding changes its bytes.
const oddResult = `{"b":1,  "a":[2,1]}`

// A worker's replies (RouteOpts.Reply) to a request and to a duplicate of
// it carry the bytes the handler set, as the row holds them, on every kind
// of route: transactional, batched in a group commit, claim mode alone
// and in a group commit, and behind the completed-cache (whose hit carries no
// result: the worker reads it from the inbox) with and without the lock.
func TestWorker_RepliesCarryTheHandlersBytes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	set := func(msg *inboxtype.Message[order]) error { return msg.SetResult(json.RawMessage(oddResult)) }
	txFn := func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if _, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, msg.Namespace); err != nil {
			return err
		}
		return set(msg)
	}
	batchFn := func(_ context.Context, wb *pgx.Batch, msg *inboxtype.Message[order]) error {
		wb.Queue(`INSERT INTO effects (id) VALUES ($1)`, msg.Namespace)
		return set(msg)
	}
	claimFn := func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		if err := set(msg); err != nil {
			return err
		}
		return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, msg.Namespace)
			return err
		})
	}
	type route struct {
		name     string
		queue    string
		cacheKey func(queue string) string // the completed-cache's entry, if the duplicate is its hit
	}
	// Two workers: one without Redis (no completed-cache) and one with it.
	plain, cached := inboxmq.NewRoutes(), inboxmq.NewRoutes()
	var all []*route
	add := func(name string, cacheKey func(string) string, register func(queue string)) {
		r := &route{name: name, cacheKey: cacheKey, queue: amqptest.QueueName(t)}
		register(r.queue)
		all = append(all, r)
	}
	cacheEntry := func(q string) string { return "inboxmq:done:" + q + ":order:rpc" }
	add("tx", nil, func(q string) {
		inboxmq.HandleTx(plain, q, txFn, &inboxmq.RouteOpts{Reply: true})
	})
	add("batch_group", nil, func(q string) {
		inboxmq.HandleBatch(plain, q, batchFn, &inboxmq.RouteOpts{Reply: true, GroupCommit: &inbox.GroupCommit{}})
	})
	add("claim", nil, func(q string) {
		inboxmq.HandleClaim(plain, q, claimFn, &inboxmq.RouteOpts{Reply: true})
	})
	add("claim_group", nil, func(q string) {
		inboxmq.HandleClaim(plain, q, claimFn, &inboxmq.RouteOpts{Reply: true, GroupCommit: &inbox.GroupCommit{}})
	})
	add("tx_cache", cacheEntry, func(q string) {
		inboxmq.HandleTx(cached, q, txFn, &inboxmq.RouteOpts{Reply: true})
	})
	add("tx_cache_lock", cacheEntry, func(q string) {
		inboxmq.HandleTx(cached, q, txFn, &inboxmq.RouteOpts{Reply: true, Lock: &inboxmq.LockOpts{}})
	})
	rdb := redisFor(t, "rpc")
	reg, cachedReg := prometheus.NewRegistry(), prometheus.NewRegistry()
	for _, cfg := range []*inboxmq.Config{
		{URL: testenv.AMQPURL(), DB: b.pool, Routes: plain, Registerer: reg},
		{URL: testenv.AMQPURL(), DB: b.pool, Routes: cached, Redis: rdb, Registerer: cachedReg},
	} {
		w, err := inboxmq.NewWorker(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = w.Stop(context.Background()) })
		require.NoError(t, w.Start(t.Context()))
	}

	ch, err := b.conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	rq, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	replies, err := ch.Consume(rq.Name, "", true, true, false, false, nil)
	require.NoError(t, err)
	request := func(queue, corr string) amqp.Delivery {
		t.Helper()
		b.pub.Publish(queue, []byte(`{"id":"rpc"}`), amqp.Publishing{MessageId: corr, ReplyTo: rq.Name, CorrelationId: corr})
		d := testenv.WaitChan(t, replies, "the reply to "+corr)
		require.Equal(t, corr, d.CorrelationId)
		return d
	}

	for _, r := range all {
		first := request(r.queue, r.name+"-first")
		require.Equal(t, oddResult, string(first.Body), "%s: the first reply carries the handler's bytes", r.name)
		require.NotContains(t, first.Headers, inboxtype.HeaderReplayedOutcome, "%s: a first answer", r.name)
		var stored string
		require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT result::text FROM inboxmq_inbox WHERE consumer = $1 AND key = 'order:rpc'`,
			r.queue).Scan(&stored))
		require.Equal(t, oddResult, stored, "%s: the row holds them", r.name)
		source := "inbox"
		if r.cacheKey != nil {
			source = "cache"
			testenv.WaitFor(t, r.name+": the completed-cache holds the key", func() bool {
				n, err := rdb.Exists(t.Context(), r.cacheKey(r.queue)).Result()
				return err == nil && n == 1
			})
		}
		dup := request(r.queue, r.name+"-dup")
		require.Equal(t, oddResult, string(dup.Body), "%s: a duplicate's reply carries the same bytes", r.name)
		require.Equal(t, true, dup.Headers[inboxtype.HeaderReplayedOutcome], "%s: marked as the stored outcome, replayed", r.name)
		// The counter moves once the duplicate is settled, after its reply.
		testenv.WaitFor(t, r.name+": the duplicate is counted as caught by the "+source, func() bool {
			return duplicates(t, reg, r.queue, source)+duplicates(t, cachedReg, r.queue, source) == 1
		})
	}
	require.Equal(t, len(all), b.count(t, `SELECT count(*) FROM effects`), "one effect per route")
}

// duplicates is inboxmq_duplicate_detected_total{queue, source}.
func duplicates(t *testing.T, reg *prometheus.Registry, queue, source string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "inboxmq_duplicate_detected_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["queue"] == queue && labels["source"] == source {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
