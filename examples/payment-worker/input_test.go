package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// publishJSON publishes one payment body (an order as JSON) under a new
// message id.
func (b *testBundle) publishJSON(t testing.TB, p Payment) {
	t.Helper()
	body, err := json.Marshal(p)
	require.NoError(t, err)
	b.pub.Publish(b.queue, body, amqp.Publishing{MessageId: newID()})
}

// cacheRedis connects to the worker's Redis and deletes the worker's
// completed-cache and lock keys (they contain the test's queue name) when
// the test ends.
func (b *testBundle) cacheRedis(t testing.TB) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(testenv.RedisURL())
	require.NoError(t, err)
	rdb := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		testenv.Unavailable(t, "Redis", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		iter := rdb.Scan(ctx, 0, "*"+b.queue+"*", 500).Iterator()
		for iter.Next(ctx) {
			_ = rdb.Del(ctx, iter.Val()).Err()
		}
		_ = rdb.Close()
	})
	return rdb
}

// cacheKey is the worker's completed-cache entry for an order (Cache's
// default prefix, the queue as consumer name).
func (b *testBundle) cacheKey(orderID string) string {
	return "inboxmq:done:" + b.queue + ":payment:" + orderID
}

// paid returns the amount and currency the order was paid with, and
// requires exactly one payment and one ledger entry for it.
func (b *testBundle) paid(t *testing.T, orderID string) Payment {
	t.Helper()
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM payments WHERE order_id = $1`, orderID), "payments of %q", orderID)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM ledger_entries WHERE order_id = $1`, orderID), "ledger entries of %q", orderID)
	p := Payment{OrderID: orderID}
	require.NoError(t, b.pool.QueryRow(t.Context(),
		`SELECT amount_cents, currency FROM payments WHERE order_id = $1`, orderID).Scan(&p.AmountCents, &p.Currency))
	return p
}

// deadLetters drains the DLQ and returns its payments by order id, each
// required to carry an x-error with the given reason.
func (b *testBundle) deadLetters(t *testing.T, reason string) map[string][]Payment {
	t.Helper()
	out := map[string][]Payment{}
	for _, d := range amqptest.Drain(t, b.conn, b.queue+".dlq") {
		xerr, _ := d.Headers[inboxtype.HeaderError].(string)
		require.True(t, strings.HasPrefix(xerr, reason+": "), "dead letter %s: x-error %q, want reason %s", d.Body, xerr, reason)
		var p Payment
		require.NoError(t, json.Unmarshal(d.Body, &p))
		out[p.OrderID] = append(out[p.OrderID], p)
	}
	return out
}

// A reused key with another amount or currency is a key conflict, whether
// the completed-cache knows the first job (warm), does not (cold: flushed),
// or the two copies are in flight at once (racing). The first payment
// stands; the conflict is dead-lettered, never acked as a duplicate.
func TestWorkerKeyConflictWithCompletedCache(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.migrate(t)
	rdb := b.cacheRedis(t)
	w := b.start(t)
	ctx := t.Context()
	first := func(id string) Payment { return Payment{OrderID: id, AmountCents: 100, Currency: "USD"} }
	// warming counts the copies payOnce sent to fill the cache: on a loaded
	// machine a cache write can time out (the cache is only an accelerator,
	// and the worker goes on without it), and a copy, a duplicate the inbox
	// catches, writes the entry again once Redis answers.
	warming := 0
	payOnce := func(id string) {
		b.publishJSON(t, first(id))
		testenv.WaitFor(t, id+" is paid", func() bool {
			return b.count(t, `SELECT count(*) FROM payments WHERE order_id = $1`, id) == 1
		})
		sent := time.Now()
		testenv.WaitFor(t, id+" is cached", func() bool {
			if rdb.Exists(ctx, b.cacheKey(id)).Val() == 1 {
				return true
			}
			if time.Since(sent) > time.Second && amqptest.Depth(t, b.conn, b.queue) == 0 {
				b.publishJSON(t, first(id))
				warming++
				sent = time.Now()
			}
			return false
		})
	}

	// Warm: the cache holds the first job. A copy of it is a cache hit;
	// another amount or currency is not.
	payOnce("warm")
	b.publishJSON(t, Payment{OrderID: "warm", AmountCents: 200, Currency: "USD"})
	b.publishJSON(t, Payment{OrderID: "warm", AmountCents: 100, Currency: "EUR"})
	b.publishJSON(t, first("warm"))

	// Cold: the cache lost the entry (flushed, evicted); the inbox decides,
	// and a conflict leaves nothing in the cache that a later copy of the
	// conflicting job could hit.
	payOnce("cold")
	require.NoError(t, rdb.Del(ctx, b.cacheKey("cold")).Err())
	b.publishJSON(t, Payment{OrderID: "cold", AmountCents: 200, Currency: "USD"})
	testenv.WaitFor(t, "the cold conflict is dead-lettered", func() bool {
		return amqptest.Depth(t, b.conn, b.queue+".dlq") >= 1
	})
	b.publishJSON(t, Payment{OrderID: "cold", AmountCents: 200, Currency: "USD"})
	b.publishJSON(t, first("cold"))

	// Racing: two jobs of one order published back to back.
	const races = 10
	for i := range races {
		id := fmt.Sprintf("race-%02d", i)
		b.publishJSON(t, first(id))
		b.publishJSON(t, Payment{OrderID: id, AmountCents: 200, Currency: "USD"})
	}

	const conflicts = 2 + 2 + races
	testenv.WaitFor(t, "every conflict is dead-lettered and every copy of a paid job acked", func() bool {
		return amqptest.Depth(t, b.conn, b.queue+".dlq") >= conflicts &&
			b.count(t, `SELECT count(*) FROM payments WHERE order_id LIKE 'race-%'`) == races &&
			w.metricSum(t, "duplicate_detected_total") >= float64(2+warming)
	})
	testenv.WaitFor(t, "the work queue is empty", func() bool { return amqptest.Depth(t, b.conn, b.queue) == 0 })

	dead := b.deadLetters(t, "key_conflict")
	require.Equal(t, first("warm"), b.paid(t, "warm"), "the first payment stands")
	require.ElementsMatch(t, []Payment{
		{OrderID: "warm", AmountCents: 200, Currency: "USD"},
		{OrderID: "warm", AmountCents: 100, Currency: "EUR"},
	}, dead["warm"])
	require.Equal(t, first("cold"), b.paid(t, "cold"))
	require.Equal(t, []Payment{
		{OrderID: "cold", AmountCents: 200, Currency: "USD"},
		{OrderID: "cold", AmountCents: 200, Currency: "USD"},
	}, dead["cold"])
	for i := range races {
		id := fmt.Sprintf("race-%02d", i)
		got := b.paid(t, id)
		require.Len(t, dead[id], 1, "%s: one of the two jobs is the conflict", id)
		require.NotEqual(t, got.AmountCents, dead[id][0].AmountCents, "%s: the conflict is the job that was not paid", id)
	}
	require.Len(t, dead, 2+races, "no other dead letters")
	require.InDelta(t, 2+warming, w.metricSum(t, "duplicate_detected_total"), 0, "the copies of the first jobs, and nothing else, are duplicates")
	w.stop(t)
}

// With Redis down the inbox alone dead-letters the conflict.
func TestWorkerKeyConflictWithoutRedis(t *testing.T) {
	t.Parallel()
	b := setup(t, "REDIS_URL=redis://127.0.0.1:9/0") // nothing listens on the discard port
	b.migrate(t)
	w := b.start(t)
	paid := Payment{OrderID: "down", AmountCents: 100, Currency: "USD"}
	b.publishJSON(t, paid)
	testenv.WaitFor(t, "the first job is paid", func() bool {
		return b.count(t, `SELECT count(*) FROM payments WHERE order_id = 'down'`) == 1
	})
	b.publishJSON(t, Payment{OrderID: "down", AmountCents: 200, Currency: "USD"})
	testenv.WaitFor(t, "the conflict is dead-lettered", func() bool {
		return amqptest.Depth(t, b.conn, b.queue+".dlq") >= 1
	})
	require.Equal(t, []Payment{{OrderID: "down", AmountCents: 200, Currency: "USD"}}, b.deadLetters(t, "key_conflict")["down"])
	require.Equal(t, paid, b.paid(t, "down"), "the first payment stands")
	w.stop(t)
}

// invalidBodies are inputs the contract calls invalid: each is dead-lettered
// at once, with reason decode or invalid, and writes nothing.
var invalidBodies = []struct {
	name string
	body string
}{
	{"invalid UTF-8 (0xff)", "{\"order_id\":\"bad\xffX\",\"amount_cents\":100,\"currency\":\"EUR\"}"},
	{"invalid UTF-8 (0xfe)", "{\"order_id\":\"bad\xfeX\",\"amount_cents\":100,\"currency\":\"EUR\"}"},
	{"order_id only spaces", `{"order_id":"   ","amount_cents":100,"currency":"EUR"}`},
	{"order_id only a tab", `{"order_id":"\t","amount_cents":100,"currency":"EUR"}`},
	{"order_id with CR LF", `{"order_id":"crlf\r\nX-Injected: 1","amount_cents":100,"currency":"EUR"}`},
	{"order_id with NUL", `{"order_id":"nul\u0000x","amount_cents":100,"currency":"EUR"}`},
	{"order_id with DEL", `{"order_id":"del` + "\x7f" + `x","amount_cents":100,"currency":"EUR"}`},
	{"order_id of 201 bytes", `{"order_id":"` + strings.Repeat("o", 201) + `","amount_cents":100,"currency":"EUR"}`},
	{"order_id null", `{"order_id":null,"amount_cents":100,"currency":"EUR"}`},
	{"order_id a number", `{"order_id":7,"amount_cents":100,"currency":"EUR"}`},
	{"amount_cents a float", `{"order_id":"float","amount_cents":1.5,"currency":"EUR"}`},
	{"amount_cents past 2^63-1", `{"order_id":"huge","amount_cents":9223372036854775808,"currency":"EUR"}`},
	{"amount_cents missing", `{"order_id":"noamount","currency":"EUR"}`},
	{"currency null", `{"order_id":"nocur","amount_cents":100,"currency":null}`},
	{"an array", `[{"order_id":"arr","amount_cents":100,"currency":"EUR"}]`},
	{"JSON null", `null`},
}

// validEdges are inputs the contract accepts, each paid exactly as sent.
var validEdges = []Payment{
	{OrderID: " spaced ", AmountCents: 100, Currency: "EUR"},
	{OrderID: "spaced", AmountCents: 100, Currency: "EUR"}, // another order than " spaced "
	{OrderID: "zoë-€", AmountCents: 1<<63 - 1, Currency: "EUR"},
	{OrderID: strings.Repeat("o", 200), AmountCents: 1, Currency: "EUR"},
}

// Invalid input is dead-lettered at once (no retries) with x-error, and
// writes and charges nothing, in both modes; the valid edges are paid under
// their order_id exactly as sent.
func TestWorkerInvalidInputIsDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"transactional", "gateway"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			gw := &gateway{calls: map[string][]string{}, paid: map[string]int{}}
			var env []string
			if mode == "gateway" {
				env = append(env, "GATEWAY_URL="+newLoopbackServer(t, gw))
			}
			b := setup(t, env...)
			b.migrate(t)
			w := b.start(t)
			for _, in := range invalidBodies {
				b.pub.Publish(b.queue, []byte(in.body), amqp.Publishing{MessageId: newID()})
			}
			for _, p := range validEdges {
				b.publishJSON(t, p)
			}
			testenv.WaitFor(t, "every invalid body is dead-lettered and every valid one paid", func() bool {
				return amqptest.Depth(t, b.conn, b.queue+".dlq") >= len(invalidBodies) &&
					b.count(t, `SELECT count(*) FROM payments`) >= len(validEdges)
			})
			// An unknown extra field is ignored: the same order again, a
			// duplicate (sent after the first copy is paid, so that no lock
			// contention adds retries).
			for _, p := range validEdges {
				body, err := json.Marshal(p)
				require.NoError(t, err)
				extra := slices.Concat(body[:len(body)-1], []byte(`,"note":"again"}`))
				b.pub.Publish(b.queue, extra, amqp.Publishing{MessageId: newID()})
			}
			testenv.WaitFor(t, "every copy with an extra field is a duplicate", func() bool {
				return int(w.metricSum(t, "duplicate_detected_total")) >= len(validEdges)
			})
			testenv.WaitFor(t, "the work queue is empty", func() bool { return amqptest.Depth(t, b.conn, b.queue) == 0 })

			dead := amqptest.Drain(t, b.conn, b.queue+".dlq")
			require.Len(t, dead, len(invalidBodies))
			bodies := map[string]bool{}
			for _, d := range dead {
				xerr, _ := d.Headers[inboxtype.HeaderError].(string)
				require.True(t, strings.HasPrefix(xerr, "decode: ") || strings.HasPrefix(xerr, "invalid: "),
					"dead letter %q: x-error %q", d.Body, xerr)
				require.LessOrEqual(t, inboxtype.HeaderInt(d.Headers, inboxtype.HeaderAttempt), 1, "dead-lettered at the first attempt")
				bodies[string(d.Body)] = true
			}
			for _, in := range invalidBodies {
				require.True(t, bodies[in.body], "%s is in the DLQ, unchanged", in.name)
			}
			require.Zero(t, w.metricSum(t, "job_retry_total"), "nothing was retried")

			require.Equal(t, len(validEdges), b.count(t, `SELECT count(*) FROM payments`), "only the valid orders are paid")
			require.Equal(t, len(validEdges), b.count(t, `SELECT count(*) FROM ledger_entries`))
			for _, p := range validEdges {
				require.Equal(t, p, b.paid(t, p.OrderID), "%q is paid exactly as sent", p.OrderID)
			}
			if mode == "gateway" {
				calls, paid := gw.snapshot()
				require.Len(t, calls, len(validEdges), "the gateway saw only the valid orders: %v", calls)
				for _, p := range validEdges {
					require.Equal(t, 1, paid[p.OrderID], "one charge for %q", p.OrderID)
				}
			}
			w.stop(t)
		})
	}
}
