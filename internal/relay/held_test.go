package relay

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/amqpdial"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/outbox"
)

// TestBatchIsOneSocketWrite: a batch of n rows goes to the broker in one
// socket write, and every row is confirmed and marked sent.
func TestBatchIsOneSocketWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 25
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = msgTo(b.queue, fmt.Sprintf("write-%d", i))
	}
	enqueue(t, b.pool, msgs...) // before the relay starts: one claim takes all

	r, _ := b.newRelay(t, &Config{BatchSize: n, Concurrency: 1, Retention: -1})
	type batch struct {
		rows   int
		writes int64
		err    error
	}
	var mu sync.Mutex
	var batches []batch
	r.hooks.released = func(rows int, writes int64, err error) {
		mu.Lock()
		defer mu.Unlock()
		batches = append(batches, batch{rows, writes, err})
	}
	start(t, r)
	waitAllSent(t, b.pool, n)

	mu.Lock()
	require.Equal(t, []batch{{rows: n, writes: 1}}, batches, "one batch of every row, in one write")
	mu.Unlock()
	got := amqptest.Drain(t, b.conn, b.queue)
	require.Len(t, got, n)
}

// TestBatchWriteFailsRowsRetried: the socket breaks while a batch's writes
// are held; the batch's write fails, its rows stay pending (none marked
// sent), and the lane reconnects and publishes them.
func TestBatchWriteFailsRowsRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 10
	want := make([]string, n)
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		want[i] = fmt.Sprintf("broken-%d", i)
		msgs[i] = msgTo(b.queue, want[i])
	}
	enqueue(t, b.pool, msgs...)

	r, _ := b.newRelay(t, &Config{BatchSize: n, Concurrency: 1, Retention: -1})
	var cut atomic.Bool
	r.hooks.held = func(sock *amqpdial.HoldConn) {
		if cut.CompareAndSwap(false, true) {
			_ = sock.Conn.Close() // the socket under the hold: the write must fail
		}
	}
	var mu sync.Mutex
	var errs []error
	var claims []int
	r.hooks.released = func(_ int, _ int64, err error) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, err)
	}
	r.hooks.claimed = func(rows int) {
		mu.Lock()
		defer mu.Unlock()
		claims = append(claims, rows)
	}
	start(t, r)
	waitAllSent(t, b.pool, n)

	mu.Lock()
	require.GreaterOrEqual(t, len(errs), 2, "the failed batch and its retry")
	require.Error(t, errs[0], "the broken socket's write failed")
	require.NoError(t, errs[1])
	require.Equal(t, []int{n, n}, claims[:2], "the failed batch's rows were left pending and claimed again")
	mu.Unlock()
	require.InDelta(t, float64(n), testutil.ToFloat64(r.metrics.failed.WithLabelValues(reasonUnconfirmed)), 0,
		"the failed batch's rows counted unconfirmed")

	var got []string
	for _, d := range amqptest.Drain(t, b.conn, b.queue) {
		got = append(got, string(d.Body))
	}
	slices.Sort(got)
	got = slices.Compact(got)
	slices.Sort(want)
	require.Equal(t, want, got, "every row went out after the reconnect")
}
