package inboxmq_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// accountEvent is the Seq-th event of an account.
type accountEvent struct {
	Account string `json:"account"`
	Seq     int    `json:"seq"`
}

func (e accountEvent) IdempotencyKey() string { return e.Account + ":" + strconv.Itoa(e.Seq) }

// Three workers, each with its own connections, consume an ordered route
// while they join and leave mid-stream, and the stream carries copies of
// some events (right behind the original and far behind it). Every
// account's effects commit in publish order, each exactly once, and each
// worker that joined took shards over.
func TestWorker_OrderedAcrossWorkers(t *testing.T) {
	t.Parallel()
	amqptest.RequireConsistentHash(t)
	url := amqptest.Vhost(t)
	conn := amqptest.DialURL(t, url)
	pool, _ := pgtest.Schema(t)
	_, err := pool.Exec(t.Context(), `CREATE TABLE account_effects (id bigserial PRIMARY KEY, account text NOT NULL, seq int NOT NULL, worker text NOT NULL)`)
	require.NoError(t, err)
	const queue, shards, accounts = "ledger", 6, 24

	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[accountEvent]) error {
		// Work of varying length: an event not held back behind its
		// predecessor would overtake it.
		select {
		case <-time.After(time.Duration(msg.Body.Seq*7%4) * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		_, err := tx.Exec(ctx, `INSERT INTO account_effects (account, seq, worker) VALUES ($1, $2, $3)`,
			msg.Body.Account, msg.Body.Seq, msg.Delivery.WorkerID)
		return err
	}, &inboxmq.RouteOpts{
		Concurrency: 4,
		// Classic shards take Concurrency deliveries at once; quorum ones
		// one each (see OrderedOpts), which the consumer's tests cover.
		Queue:   &inboxmq.QueueOpts{Type: inboxmq.Classic},
		Ordered: &inboxmq.OrderedOpts{Shards: shards, RebalanceInterval: 100 * time.Millisecond},
	})
	start := func(name string) *inboxmq.Worker {
		w, err := inboxmq.NewWorker(&inboxmq.Config{URL: url, DB: pool, Routes: routes, Name: name})
		require.NoError(t, err)
		t.Cleanup(func() { _ = w.Stop(context.Background()) })
		require.NoError(t, w.Start(t.Context()))
		return w
	}
	applied := func(worker string) int {
		var n int
		require.NoError(t, pool.QueryRow(t.Context(),
			`SELECT count(*) FROM account_effects WHERE $1 = '' OR worker = $1`, worker).Scan(&n))
		return n
	}

	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	last := make(map[string]int)
	var sent []accountEvent
	n := 0
	publish := func(count int) {
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
		defer cancel()
		var confirms []*amqp.DeferredConfirmation
		send := func(e accountEvent) {
			body, err := json.Marshal(e)
			require.NoError(t, err)
			// The ordering key is the routing key on the route's exchange.
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, queue, e.Account, true, false, amqp.Publishing{
				MessageId: e.IdempotencyKey(), DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: body,
			})
			require.NoError(t, err)
			confirms = append(confirms, dc)
		}
		for range count {
			account := "acct-" + strconv.Itoa(n%accounts)
			last[account]++
			e := accountEvent{Account: account, Seq: last[account]}
			send(e)
			sent = append(sent, e)
			switch {
			case n%11 == 0:
				send(e) // a copy right behind the original
			case n%13 == 0 && len(sent) > 60:
				send(sent[len(sent)-60]) // a copy far behind
			}
			n++
		}
		for _, dc := range confirms {
			ok, err := dc.WaitContext(ctx)
			require.NoError(t, err)
			require.True(t, ok)
		}
	}
	keepPublishing := func(what string, cond func() bool) {
		deadline := time.Now().Add(testenv.Timeout())
		for !cond() {
			require.False(t, time.Now().After(deadline), "timed out waiting for: %s", what)
			publish(48)
		}
	}

	a := start("worker-a")
	keepPublishing("worker-a applies events", func() bool { return applied("worker-a") >= 40 })
	start("worker-b")
	keepPublishing("worker-b takes shards over", func() bool { return applied("worker-b") >= 30 })
	start("worker-c")
	keepPublishing("worker-c takes shards over", func() bool { return applied("worker-c") >= 30 })
	ctx, cancel := context.WithTimeout(t.Context(), testenv.Timeout())
	defer cancel()
	require.NoError(t, a.Stop(ctx)) // worker-a leaves mid-stream
	before := applied("worker-b") + applied("worker-c")
	keepPublishing("the others take worker-a's shards", func() bool {
		return applied("worker-b")+applied("worker-c") >= before+60
	})
	publish(40)

	total := 0
	for _, v := range last {
		total += v
	}
	testenv.WaitFor(t, "every event applied", func() bool { return applied("") >= total })
	rows, err := pool.Query(t.Context(), `SELECT account, seq FROM account_effects ORDER BY id`)
	require.NoError(t, err)
	seqs := make(map[string][]int)
	for rows.Next() {
		var account string
		var seq int
		require.NoError(t, rows.Scan(&account, &seq))
		seqs[account] = append(seqs[account], seq)
	}
	require.NoError(t, rows.Err())
	for account, n := range last {
		want := make([]int, n)
		for i := range want {
			want[i] = i + 1
		}
		require.Equal(t, want, seqs[account], "account %s: effects out of order, missing or repeated", account)
	}
	require.Equal(t, total, applied(""), "an event applied twice")
	t.Logf("%d events; applied by a=%d b=%d c=%d", total, applied("worker-a"), applied("worker-b"), applied("worker-c"))
}
