package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/startstop"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/outbox"
	"github.com/inboxmq/inboxmq/retry"
)

func TestRolledBackTransactionPublishesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, _ := b.newRelay(t, nil)
	start(t, r)

	errRollback := errors.New("business rule failed")
	err := pgx.BeginFunc(t.Context(), b.pool, func(tx pgx.Tx) error {
		require.NoError(t, outbox.Enqueue(t.Context(), tx, msgTo(b.queue, "rolled-back")))
		return errRollback
	})
	require.ErrorIs(t, err, errRollback)
	enqueue(t, b.pool, msgTo(b.queue, "committed"))

	waitAllSent(t, b.pool, 1)
	got := amqptest.Drain(t, b.conn, b.queue)
	require.Len(t, got, 1)
	require.Equal(t, "committed", string(got[0].Body))
	require.Equal(t, 1, countRows(t, b.pool, "true"))
}

func TestCommittedMessagePublishedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, reg := b.newRelay(t, nil)

	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(t.Context(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled,
	}))
	msg := outbox.Message{
		RoutingKey:     b.queue,
		IdempotencyKey: "payment-42",
		OrderingKey:    "account-7",
		ContentType:    "application/json",
		Headers:        amqp.Table{"x-tenant": "acme", "x-version": int32(3)},
		Body:           []byte(`{"id":42}`),
	}
	for range 2 { // a handler re-run enqueues the same message id: a no-op
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return outbox.Enqueue(ctx, tx, msg) }))
	}
	require.Equal(t, 1, countRows(t, b.pool, "true"))

	start(t, r)
	waitAllSent(t, b.pool, 1)
	got := amqptest.Drain(t, b.conn, b.queue)
	require.Len(t, got, 1)
	d := got[0]
	require.Equal(t, outbox.DeriveID("", b.queue, "payment-42"), d.MessageId)
	require.Equal(t, `{"id":42}`, string(d.Body))
	require.Equal(t, "application/json", d.ContentType)
	require.Equal(t, amqp.Persistent, d.DeliveryMode)
	require.Equal(t, "payment-42", d.Headers[inboxtype.HeaderIdempotencyKey])
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", d.Headers["traceparent"])
	require.Equal(t, "acme", d.Headers["x-tenant"])
	require.Equal(t, int32(3), d.Headers["x-version"])

	require.InDelta(t, 1.0, testutil.ToFloat64(r.metrics.published), 0)
	require.Equal(t, 1, testutil.CollectAndCount(reg, "inboxmq_outbox_relay_lag_seconds"))
	require.InDelta(t, 0.0, testutil.ToFloat64(r.metrics.failed.WithLabelValues(reasonNack)), 0)
}

func TestCrashBetweenConfirmAndMarkRepublishesSameID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	enqueue(t, b.pool, msgTo(b.queue, "order-1"), msgTo(b.queue, "order-2"))

	// The first relay dies after the broker confirmed the batch and before
	// it marked the rows sent.
	errKilled := errors.New("relay killed")
	first, _ := b.newRelay(t, nil)
	confirmed := make(chan []string, 1)
	first.hooks.afterConfirm = func(ids []string) error {
		select {
		case confirmed <- ids:
		default:
		}
		return errKilled
	}
	require.NoError(t, first.Start(t.Context()))
	ids := testenv.WaitChan(t, confirmed, "first relay's confirm")
	testenv.WaitChan(t, first.Stopped(), "first relay to die")
	require.ErrorIs(t, first.Stop(t.Context()), errKilled, "Stop returns the run's end")
	require.Len(t, ids, 2)
	require.Equal(t, 2, countRows(t, b.pool, "sent_at IS NULL"), "rows stay pending")

	second, _ := b.newRelay(t, nil)
	start(t, second)
	waitAllSent(t, b.pool, 2)

	got := amqptest.Drain(t, b.conn, b.queue)
	require.Len(t, got, 4, "each message published twice")
	byID := map[string][]amqp.Delivery{}
	for _, d := range got {
		byID[d.MessageId] = append(byID[d.MessageId], d)
	}
	require.Len(t, byID, 2)
	for id, ds := range byID {
		require.Contains(t, ids, id)
		require.Len(t, ds, 2)
		require.Equal(t, ds[0].Headers[inboxtype.HeaderIdempotencyKey], ds[1].Headers[inboxtype.HeaderIdempotencyKey])
		require.Equal(t, outbox.DeriveID("", b.queue, ds[0].Headers[inboxtype.HeaderIdempotencyKey].(string)), id)
	}

	// End to end: the receiver's inbox absorbs the duplicates, so each
	// business effect happens once.
	store, err := inbox.NewStore(b.pool, nil)
	if err == nil {
		err = store.Check(t.Context())
	}
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), `CREATE TABLE effects (key text PRIMARY KEY)`)
	require.NoError(t, err)
	h := inbox.Handler(store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[string]) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (key) VALUES ($1)`, msg.Key)
		return err
	}, nil)
	var handled, duplicates int
	for i := range got {
		d := &got[i]
		key, _ := d.Headers[inboxtype.HeaderIdempotencyKey].(string)
		msg := &inboxtype.Message[string]{
			ID: d.MessageId, Key: key, Namespace: "receiver", Body: string(d.Body), Headers: d.Headers, Attempt: 1,
			Delivery: inboxtype.NewDelivery(b.queue, "receiver", "test", d),
		}
		switch err := h.Handle(t.Context(), msg); {
		case err == nil:
			handled++
		case errors.Is(err, retry.ErrDuplicate):
			duplicates++
		default:
			require.NoError(t, err)
		}
	}
	require.Equal(t, 2, handled)
	require.Equal(t, 2, duplicates)
	require.Equal(t, 2, countTable(t, b.pool, "effects"))
}

func countTable(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

func TestTwoRelaysPublishEachRowOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 300
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = msgTo(b.queue, "m-"+strconv.Itoa(i))
	}
	enqueue(t, b.pool, msgs...)

	r1, _ := b.newRelay(t, &Config{BatchSize: 7})
	r2, _ := b.newRelay(t, &Config{BatchSize: 7})
	start(t, r1)
	start(t, r2)
	waitAllSent(t, b.pool, n)

	got := amqptest.Drain(t, b.conn, b.queue)
	require.Len(t, got, n)
	seen := map[string]bool{}
	for _, d := range got {
		require.False(t, seen[d.MessageId], "duplicate %s", d.MessageId)
		seen[d.MessageId] = true
	}
	p1, p2 := testutil.ToFloat64(r1.metrics.published), testutil.ToFloat64(r2.metrics.published)
	require.InDelta(t, float64(n), p1+p2, 0)
}

func TestBrokerDownRowsWaitAndGoOutAfterReconnect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	px := newProxy(t, false)
	r, _ := b.newRelay(t, &Config{URL: px.URL(), BatchSize: 5, StatsInterval: 10 * time.Millisecond})
	start(t, r)

	var want []string
	for i := range 12 {
		k := "down-" + strconv.Itoa(i)
		want = append(want, k)
		enqueue(t, b.pool, msgTo(b.queue, k))
	}
	for range 3 { // the relay keeps trying while the broker is unreachable
		testenv.WaitChan(t, px.accepts, "relay dial attempt")
	}
	require.Equal(t, 12, countRows(t, b.pool, "sent_at IS NULL"))
	testenv.WaitFor(t, "pending gauge", func() bool { return testutil.ToFloat64(r.metrics.pending) == 12 })
	require.Positive(t, testutil.ToFloat64(r.metrics.oldestAge))

	px.setUp(true)
	waitAllSent(t, b.pool, 12)

	// The connection is lost mid-run (server gone); new rows wait and go
	// out after the reconnect.
	px.cut()
	for i := range 12 {
		k := "cut-" + strconv.Itoa(i)
		want = append(want, k)
		enqueue(t, b.pool, msgTo(b.queue, k))
	}
	waitAllSent(t, b.pool, 24)

	var got []string
	for _, d := range amqptest.Drain(t, b.conn, b.queue) {
		got = append(got, string(d.Body))
	}
	slices.Sort(got)
	got = slices.Compact(got) // a cut mid-batch may duplicate; never lose
	slices.Sort(want)
	require.Equal(t, want, got)
	testenv.WaitFor(t, "pending gauge back to 0", func() bool { return testutil.ToFloat64(r.metrics.pending) == 0 })
}

// TestOrderedHoldsBackLaterRowsOfAKey: the head of key A is unroutable (its
// queue does not exist yet), so it backs off; A's later rows wait for it
// while other keys flow. The relay at its defaults does so: ordering keys
// are always honoured.
func TestOrderedHoldsBackLaterRowsOfAKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	missing := amqptest.QueueName(t) // declared later
	a1 := outbox.Message{RoutingKey: missing, IdempotencyKey: "a1", OrderingKey: "A", Body: []byte("a1")}
	a2 := outbox.Message{RoutingKey: b.queue, IdempotencyKey: "a2", OrderingKey: "A", Body: []byte("a2")}
	b1 := outbox.Message{RoutingKey: b.queue, IdempotencyKey: "b1", OrderingKey: "B", Body: []byte("b1")}
	enqueue(t, b.pool, a1, a2, b1)

	r, _ := b.newRelay(t, nil)
	start(t, r)
	testenv.WaitFor(t, "a1 returned twice", func() bool {
		return countRows(t, b.pool, "idempotency_key = 'a1' AND attempts >= 2 AND last_error LIKE 'unroutable%'") == 1
	})
	require.Equal(t, 1, countRows(t, b.pool, "idempotency_key = 'b1' AND sent_at IS NOT NULL"))
	require.GreaterOrEqual(t, testutil.ToFloat64(r.metrics.failed.WithLabelValues(reasonUnroutable)), 2.0)
	require.Equal(t, 0, countRows(t, b.pool, "idempotency_key = 'a2' AND sent_at IS NOT NULL"), "a2 waits for a1")

	declareQueueNamed(t, b.conn, missing)
	waitAllSent(t, b.pool, 3)
	var a1At, a2At time.Time
	require.NoError(t, b.pool.QueryRow(t.Context(),
		`SELECT (SELECT sent_at FROM inboxmq_outbox WHERE idempotency_key = 'a1'), (SELECT sent_at FROM inboxmq_outbox WHERE idempotency_key = 'a2')`).Scan(&a1At, &a2At))
	require.True(t, a1At.Before(a2At))
	require.Len(t, amqptest.Drain(t, b.conn, missing), 1)
}

func declareQueueNamed(t *testing.T, conn *amqp.Connection, q string) {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-expires": int32(10 * 60 * 1000)})
	require.NoError(t, err)
}

// TestOrderedAcrossRelays: with two relays, each key's messages arrive in
// enqueue order.
func TestOrderedAcrossRelays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const keys, perKey = 5, 20
	var msgs []outbox.Message
	for i := range perKey {
		for k := range keys {
			key := fmt.Sprintf("k%d", k)
			msgs = append(msgs, outbox.Message{
				RoutingKey: b.queue, IdempotencyKey: fmt.Sprintf("%s-%03d", key, i), OrderingKey: key,
				Body: fmt.Appendf(nil, "%s-%03d", key, i),
			})
		}
	}
	enqueue(t, b.pool, msgs...)
	r1, _ := b.newRelay(t, &Config{BatchSize: 3})
	r2, _ := b.newRelay(t, &Config{BatchSize: 3})
	start(t, r1)
	start(t, r2)
	waitAllSent(t, b.pool, keys*perKey)

	last := map[string]string{}
	got := amqptest.Drain(t, b.conn, b.queue)
	require.Len(t, got, keys*perKey)
	for _, d := range got {
		key, _, _ := strings.Cut(string(d.Body), "-")
		require.Less(t, last[key], string(d.Body), "key %s out of order", key)
		last[key] = string(d.Body)
	}
}

func TestRetentionDeletesOnlyOldSentRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var msgs []outbox.Message
	for i := range 9 {
		msgs = append(msgs, msgTo(b.queue, "r-"+strconv.Itoa(i)))
	}
	enqueue(t, b.pool, msgs...)
	// r-0..r-4 sent two hours ago, r-5..r-6 sent just now, r-7..r-8 pending
	// but created long ago.
	_, err := b.pool.Exec(t.Context(), `UPDATE inboxmq_outbox SET sent_at = now() - interval '2 hours', created_at = now() - interval '3 hours' WHERE idempotency_key IN ('r-0','r-1','r-2','r-3','r-4')`)
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), `UPDATE inboxmq_outbox SET sent_at = now() WHERE idempotency_key IN ('r-5','r-6')`)
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), `UPDATE inboxmq_outbox SET created_at = now() - interval '3 hours' WHERE idempotency_key IN ('r-7','r-8')`)
	require.NoError(t, err)

	r, _ := b.newRelay(t, &Config{Retention: time.Hour, RetentionBatchSize: 2})
	n, err := r.PurgeSent(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(5), n)
	rows, err := b.pool.Query(t.Context(), `SELECT idempotency_key FROM inboxmq_outbox ORDER BY idempotency_key`)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"r-5", "r-6", "r-7", "r-8"}, left)

	off, _ := b.newRelay(t, &Config{Retention: -1})
	n, err = off.PurgeSent(t.Context())
	require.NoError(t, err)
	require.Zero(t, n)
}

// TestRelayStartStop: Stop without Start and Stop twice are safe, a second
// Start is refused, and Stop waits for the lanes; the relay then starts
// again.
func TestRelayStartStop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, _ := b.newRelay(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
	defer cancel()
	require.NoError(t, r.Stop(ctx), "Stop without Start")
	startCtx, cancelStart := context.WithCancel(ctx)
	require.NoError(t, r.Start(startCtx))
	cancelStart() // ctx bounds only the start
	require.ErrorIs(t, r.Start(context.Background()), startstop.ErrAlreadyStarted)
	enqueue(t, b.pool, msgTo(b.queue, "before-stop"))
	waitAllSent(t, b.pool, 1)
	stopped := r.Stopped()
	require.NoError(t, r.Stop(ctx))
	select {
	case <-stopped:
	default:
		t.Fatal("Stop returned before the relay ended")
	}
	require.NoError(t, r.Stop(ctx), "Stop twice")

	start(t, r)
	enqueue(t, b.pool, msgTo(b.queue, "after-restart"))
	waitAllSent(t, b.pool, 2)
	require.Len(t, amqptest.Drain(t, b.conn, b.queue), 2)
}

// TestNotifyWakesRelay: with polling effectively off, only the NOTIFY sent
// on commit can wake the relay.
func TestNotifyWakesRelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, _ := b.newRelay(t, &Config{PollInterval: time.Hour, Concurrency: 1})
	// The lane claims once when it starts, and the listener wakes it once
	// after LISTEN, whenever that comes (during the first claim, or after
	// the lane has parked): nothing else wakes it within the hour's poll
	// interval, so its second claim is the listener's. Wait until the lane
	// parks after that claim with no wake-up queued: only a new NOTIFY can
	// wake it then. (The lane can take the listener's wake-up and park
	// before the listening hook runs, so that hook cannot say when.)
	var claims atomic.Int64
	parked := make(chan struct{}, 1)
	r.hooks.claimed = func(int) { claims.Add(1) }
	r.hooks.idle = func(wakePending bool) {
		if claims.Load() >= 2 && !wakePending {
			notify(parked)
		}
	}
	start(t, r)
	testenv.WaitChan(t, parked, "relay parked after LISTEN")

	enqueue(t, b.pool, msgTo(b.queue, "wake-up"))
	waitAllSent(t, b.pool, 1)
	require.Len(t, amqptest.Drain(t, b.conn, b.queue), 1)
}

// TestNotifyWakesOneLane: a NOTIFY wakes one of the relay's idle lanes,
// not every lane (which would have all but one claim nothing).
func TestNotifyWakesOneLane(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const lanes = 4
	r, _ := b.newRelay(t, &Config{PollInterval: time.Hour, Concurrency: lanes})
	var parkings, claims, empty atomic.Int64
	settled := make(chan struct{}, 1)
	parked := make(chan struct{}, 16)
	r.hooks.claimed = func(rows int) {
		claims.Add(1)
		if rows == 0 {
			empty.Add(1)
		}
	}
	r.hooks.idle = func(wakePending bool) {
		// Every lane parks once after its first claim. The listener's one
		// wake-up after LISTEN (the lanes share it) makes one lane claim
		// and park once more, and nothing else wakes a lane within the
		// hour's poll interval: after that parking, with no wake-up
		// queued, only a new NOTIFY wakes a lane.
		if parkings.Add(1) >= lanes+1 && !wakePending {
			notify(settled)
		}
		parked <- struct{}{}
	}
	start(t, r)
	testenv.WaitChan(t, settled, "every lane parked after LISTEN")
	for len(parked) > 0 {
		<-parked
	}
	claims.Store(0)
	empty.Store(0)

	enqueue(t, b.pool, msgTo(b.queue, "one"))
	waitAllSent(t, b.pool, 1)
	testenv.WaitChan(t, parked, "the lane that published parked again")
	// Every lane woken by the NOTIFY would add lanes-1 = 3 empty claims.
	require.Zero(t, empty.Load(), "no lane woke to claim nothing")
	require.Equal(t, int64(1), claims.Load(), "one lane claimed the row")
	require.Len(t, amqptest.Drain(t, b.conn, b.queue), 1)
}

// TestOversizedRowFailsAlone: a row whose headers cannot fit in one frame
// of the connection (the broker would close the connection on it) backs
// off on its own, as an invalid row; the rows of its batch go out.
func TestOversizedRowFailsAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	big := msgTo(b.queue, "big")
	big.Headers = amqp.Table{"x-big": strings.Repeat("x", 256<<10)} // more than any frame_max
	enqueue(t, b.pool, msgTo(b.queue, "a"), big, msgTo(b.queue, "b"))

	r, _ := b.newRelay(t, &Config{BatchSize: 3, Concurrency: 1, Retention: -1})
	start(t, r)
	testenv.WaitFor(t, "the small rows sent, the big one failed twice", func() bool {
		return countRows(t, b.pool, "sent_at IS NOT NULL") == 2 &&
			countRows(t, b.pool, "idempotency_key = 'big' AND sent_at IS NULL AND attempts >= 2 AND last_error LIKE 'invalid: %frame size%'") == 1
	})
	var got []string
	for _, d := range amqptest.Drain(t, b.conn, b.queue) {
		got = append(got, string(d.Body))
	}
	require.Equal(t, []string{"a", "b"}, got)
	require.GreaterOrEqual(t, testutil.ToFloat64(r.metrics.failed.WithLabelValues(reasonInvalid)), 2.0)
}
