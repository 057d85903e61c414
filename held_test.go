package inboxmq_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/held"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// A strict ordered route holds a key after a dead letter: its later
// messages, those already in the shard and those published during the
// hold, wait in order while other keys flow, and the worker's gauges show
// the hold. A release while the cause remains holds the key again with
// everything still waiting; a release after the fix applies the head
// and then the rest in order; a skip applies the rest without the head; a
// replay of the head from the DLQ runs it before the rest.
func TestWorker_StrictOrderedHold(t *testing.T) {
	t.Parallel()
	amqptest.RequireConsistentHash(t)
	url := amqptest.Vhost(t)
	conn := amqptest.DialURL(t, url)
	pool, _ := pgtest.Schema(t)
	ctx := t.Context()
	_, err := pool.Exec(ctx, `CREATE TABLE account_effects (id bigserial PRIMARY KEY, account text NOT NULL, seq int NOT NULL)`)
	require.NoError(t, err)
	const queue = "ledger"

	var mu sync.Mutex
	broken := map[string]bool{"acct-a:2": true, "acct-b:2": true, "acct-c:2": true}
	setBroken := func(key string, v bool) {
		mu.Lock()
		defer mu.Unlock()
		broken[key] = v
	}
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[accountEvent]) error {
		mu.Lock()
		fail := broken[msg.Body.IdempotencyKey()]
		mu.Unlock()
		if fail {
			return retry.Permanent(errors.New("ledger rejects " + msg.Body.IdempotencyKey()))
		}
		_, err := tx.Exec(ctx, `INSERT INTO account_effects (account, seq) VALUES ($1, $2)`, msg.Body.Account, msg.Body.Seq)
		return err
	}, &inboxmq.RouteOpts{
		Concurrency: 4,
		Queue:       &inboxmq.QueueOpts{Type: inboxmq.Classic},
		Ordered:     &inboxmq.OrderedOpts{Shards: 2, RebalanceInterval: -1, Strict: true},
	})
	reg := prometheus.NewRegistry()
	w, err := inboxmq.NewWorker(&inboxmq.Config{URL: url, DB: pool, Routes: routes, Name: "strict", Registerer: reg})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	require.NoError(t, w.Start(ctx))

	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	publish := func(account string, seqs ...int) {
		for _, seq := range seqs {
			e := accountEvent{Account: account, Seq: seq}
			body, err := json.Marshal(e)
			require.NoError(t, err)
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, queue, account, true, false, amqp.Publishing{
				MessageId: e.IdempotencyKey(), DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: body,
			})
			require.NoError(t, err)
			ok, err := dc.WaitContext(ctx)
			require.NoError(t, err)
			require.True(t, ok)
		}
	}
	store := held.NewStore(pool)
	heldKey := func(account string) (held.Key, bool) {
		keys, err := store.List(ctx, queue)
		require.NoError(t, err)
		for _, k := range keys {
			if k.Key == account {
				return k, true
			}
		}
		return held.Key{}, false
	}
	waitHeld := func(account string, parked int) held.Key {
		var k held.Key
		testenv.WaitFor(t, account+" held with "+itoa(parked)+" waiting", func() bool {
			var ok bool
			k, ok = heldKey(account)
			return ok && k.State == held.StateHeld && k.Parked == parked
		})
		return k
	}
	applied := func(account string) []int { return effects(t, pool, account) }
	waitApplied := func(account string, want ...int) {
		testenv.WaitFor(t, account+" applied "+itoa(len(want)), func() bool { return len(applied(account)) >= len(want) })
		require.Equal(t, want, applied(account), "%s: effects out of order, missing or repeated", account)
	}

	publish("acct-a", 1, 2, 3, 4)
	publish("acct-x", 1, 2, 3) // another key, maybe in the same shard
	k := waitHeld("acct-a", 3) // the head's copy and 3, 4
	require.Equal(t, "acct-a:2", k.HeadMessageID)
	require.Equal(t, "permanent", k.Reason)
	require.Contains(t, k.LastError, "ledger rejects acct-a:2")
	require.True(t, k.HeadParked)
	// The gauges, read now: the first gather queries the tables, and the
	// next ones within 10 s reuse its result.
	gauge := func(name string, labels ...string) float64 { return gaugeValue(t, reg, name, labels...) }
	require.InDelta(t, 1, gauge("inboxmq_held_keys", "consumer", queue, "reason", "permanent"), 0)
	require.InDelta(t, 3, gauge("inboxmq_held_messages", "consumer", queue), 0)
	require.Positive(t, gauge("inboxmq_held_key_oldest_age_seconds", "consumer", queue))
	waitApplied("acct-x", 1, 2, 3)
	// The head itself again (a resend, or a redelivery after a crash
	// before its ack) is a duplicate of the copy heading the line; a new
	// message during the hold waits behind.
	publish("acct-a", 2, 5)
	testenv.WaitFor(t, "both acked without running", func() bool { return sumByLabel(t, reg, "source", "parked") >= 2 })
	k = waitHeld("acct-a", 4)
	require.Equal(t, 4, k.Parked, "the head's resend parked")
	require.Equal(t, []int{1}, applied("acct-a"))
	require.Equal(t, 1, amqptest.Depth(t, conn, inboxtype.DeadLetterQueue(queue)), "the head's dead letter")

	// Released while the cause remains: the head fails again and the key
	// is held again, nothing lost and nothing applied.
	require.NoError(t, store.Release(ctx, queue, "acct-a"))
	testenv.WaitFor(t, "the head dead-lettered again", func() bool {
		return amqptest.Depth(t, conn, inboxtype.DeadLetterQueue(queue)) == 2
	})
	waitHeld("acct-a", 4)
	require.ErrorIs(t, store.Release(ctx, queue, "acct-nobody"), held.ErrNotHeld)
	require.Equal(t, []int{1}, applied("acct-a"))

	// Fixed and released: the head, then the rest, in order; the hold
	// ends and the next message runs at once.
	setBroken("acct-a:2", false)
	require.NoError(t, store.Release(ctx, queue, "acct-a"))
	waitApplied("acct-a", 1, 2, 3, 4, 5)
	testenv.WaitFor(t, "acct-a's hold ended", func() bool { _, ok := heldKey("acct-a"); return !ok })
	publish("acct-a", 6)
	waitApplied("acct-a", 1, 2, 3, 4, 5, 6)

	// Skipped: the rest without the head.
	publish("acct-b", 1, 2, 3, 4)
	waitHeld("acct-b", 3)
	require.NoError(t, store.Skip(ctx, queue, "acct-b"))
	waitApplied("acct-b", 1, 3, 4)
	testenv.WaitFor(t, "acct-b's hold ended", func() bool { _, ok := heldKey("acct-b"); return !ok })

	// The head replayed from the DLQ: it runs first, then the rest.
	publish("acct-c", 1, 2, 3, 4)
	waitHeld("acct-c", 3)
	setBroken("acct-c:2", false)
	res, err := consumer.ReplayDLQ(ctx, conn, queue, &consumer.ReplayOpts{MessageIDs: []string{"acct-c:2"}})
	require.NoError(t, err)
	require.Equal(t, 1, res.Replayed)
	waitApplied("acct-c", 1, 2, 3, 4)
	testenv.WaitFor(t, "acct-c's hold ended", func() bool { _, ok := heldKey("acct-c"); return !ok })
	require.Equal(t, []int{1, 2, 3}, applied("acct-x"), "the other key ran once each")
}

// effects returns the seqs applied for account, in commit order.
func effects(t *testing.T, pool *pgxpool.Pool, account string) []int {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT seq FROM account_effects WHERE account = $1 ORDER BY id`, account)
	require.NoError(t, err)
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	if seqs == nil {
		seqs = []int{}
	}
	return seqs
}

// gaugeValue gathers reg and returns the value of the gauge name with the
// given label pairs, failing when there is no such series.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if got[labels[i]] != labels[i+1] {
					continue series
				}
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0
}

// A worker with a strict route on a schema without the held-key tables
// (migration 00009 not run) does not start: the error names the fix.
func TestWorker_StrictRouteNeedsTheHeldTables(t *testing.T) {
	t.Parallel()
	amqptest.RequireConsistentHash(t)
	url := amqptest.Vhost(t)
	pool, _ := pgtest.Schema(t)
	_, err := pool.Exec(t.Context(), `DROP TABLE inboxmq_held_messages, inboxmq_held_keys`)
	require.NoError(t, err)
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, "ledger", func(context.Context, pgx.Tx, *inboxtype.Message[accountEvent]) error { return nil },
		&inboxmq.RouteOpts{Ordered: &inboxmq.OrderedOpts{Shards: 1, Strict: true}})
	w, err := inboxmq.NewWorker(&inboxmq.Config{URL: url, DB: pool, Routes: routes, Name: "strict"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	err = w.Start(t.Context())
	require.ErrorContains(t, err, "schema version 9")
}
