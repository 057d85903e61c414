package relay

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/logtest"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/outbox"
)

// tripCounter is a pgx tracer that records every round trip (a query, or a
// batch however many statements it holds) by its statements, lower-cased
// and joined with " | ".
type tripCounter struct {
	mu    sync.Mutex
	trips []string
}

func (c *tripCounter) add(s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trips = append(c.trips, s)
}

func (c *tripCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.add(strings.ToLower(strings.Fields(d.SQL)[0]))
	return ctx
}

func (c *tripCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *tripCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	stmts := make([]string, len(d.Batch.QueuedQueries))
	for i, q := range d.Batch.QueuedQueries {
		stmts[i] = strings.ToLower(strings.Fields(q.SQL)[0])
	}
	c.add(strings.Join(stmts, " | "))
	return ctx
}

func (c *tripCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *tripCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// reset forgets the round trips counted so far.
func (c *tripCounter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trips = nil
}

// count returns how many round trips were exactly s.
func (c *tripCounter) count(s string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.trips {
		if t == s {
			n++
		}
	}
	return n
}

// tracedBundle is setup with a pool whose round trips are counted.
func tracedBundle(t *testing.T) (*testBundle, *tripCounter) {
	t.Helper()
	b := setup(t)
	var schema string
	require.NoError(t, b.pool.QueryRow(t.Context(), "SELECT current_schema()").Scan(&schema))
	cfg, err := pgxpool.ParseConfig(pgtest.URL(schema))
	require.NoError(t, err)
	tc := &tripCounter{}
	cfg.ConnConfig.Tracer = tc
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b.pool = pool
	return b, tc
}

// TestBatchRoundTrips checks that a batch's transaction costs two
// PostgreSQL round trips, BEGIN with the claim and the mark with COMMIT;
// that a full batch's COMMIT carries the next BEGIN and claim (here empty,
// committed alone); and that the connection goes back to the pool idle (no
// ROLLBACK).
func TestBatchRoundTrips(t *testing.T) {
	t.Parallel()
	b, tc := tracedBundle(t)
	const n = 30
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = msgTo(b.queue, fmt.Sprintf("trip-%d", i))
	}
	enqueue(t, b.pool, msgs...) // before the relay starts: one claim takes all
	tc.reset()

	r, _ := b.newRelay(t, &Config{BatchSize: n, Concurrency: 1, Retention: -1})
	var full, empty atomic.Int64
	r.hooks.claimed = func(rows int) {
		switch rows {
		case n:
			full.Add(1)
		case 0:
			empty.Add(1)
		default:
			t.Errorf("claimed %d rows, want %d or 0", rows, n)
		}
	}
	start(t, r)
	waitAllSent(t, b.pool, n)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
	defer cancel()
	require.NoError(t, r.Stop(ctx))

	require.Equal(t, int64(1), full.Load(), "one claim took every row")
	require.Equal(t, 1, tc.count("update | commit | begin | select"), "the full batch's mark, COMMIT and the next claim in one round trip")
	require.Zero(t, tc.count("update | commit"))
	claims := tc.count("begin | select") + 1
	require.Equal(t, int(full.Load()+empty.Load()), claims, "one round trip per claim")
	require.Equal(t, int(empty.Load()), tc.count("commit"), "an empty claim commits alone")
	require.Zero(t, tc.count("rollback"))
	require.Equal(t, n, countRows(t, b.pool, "sent_at IS NOT NULL"))
	require.Zero(t, b.pool.Stat().AcquiredConns())
}

// A row enqueued while a batch is in flight makes the lane go on at once:
// the next claim travels with the batch's mark and COMMIT, and takes it.
func TestBusyLaneClaimsWithTheCommit(t *testing.T) {
	t.Parallel()
	b, tc := tracedBundle(t)
	r, _ := b.newRelay(t, &Config{Concurrency: 1, Retention: -1, GatherDelay: -1, PollInterval: time.Hour})
	claimed := make(chan int, 16)
	r.hooks.claimed = func(rows int) { claimed <- rows }
	var once sync.Once
	r.hooks.published = func(wake <-chan struct{}) {
		once.Do(func() {
			enqueue(t, b.pool, msgTo(b.queue, "busy-2"))
			testenv.WaitFor(t, "the second row's wake-up", func() bool { return len(wake) > 0 })
		})
	}
	start(t, r)
	enqueue(t, b.pool, msgTo(b.queue, "busy-1"))
	waitAllSent(t, b.pool, 2)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
	defer cancel()
	require.NoError(t, r.Stop(ctx))

	// (A wake-up left over from the relay's start, when the LISTEN
	// connection wakes the lane, may make one more claim ride along.)
	require.GreaterOrEqual(t, tc.count("update | commit | begin | select"), 1, "the second claim rode with the first COMMIT")
	var sizes []int
	for len(claimed) > 0 {
		if n := <-claimed; n > 0 {
			sizes = append(sizes, n)
		}
	}
	require.Equal(t, []int{1, 1}, sizes, "each row claimed once, by its own batch")
	require.Equal(t, 2, countRows(t, b.pool, "sent_at IS NOT NULL"))
}

// A lane woken while another lane has a batch in flight gathers before it
// claims (rows keep arriving); it does not claim at once.
func TestLaneWokenWhileAnotherIsBusyGathers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, _ := b.newRelay(t, &Config{Concurrency: 2, Retention: -1, GatherDelay: 20 * time.Millisecond, PollInterval: time.Hour})
	gathered := make(chan struct{}, 1)
	r.hooks.gather = func() { notify(gathered) }
	var first atomic.Bool
	r.hooks.published = func(<-chan struct{}) {
		// Only the first batch waits (a CompareAndSwap, not a sync.Once,
		// whose other callers would block behind it): this lane is in
		// flight, so the other one, woken by the second row, must gather
		// first.
		if first.CompareAndSwap(false, true) {
			enqueue(t, b.pool, msgTo(b.queue, "second"))
			testenv.WaitChan(t, gathered, "the other lane's gather")
		}
	}
	var idles atomic.Int64
	r.hooks.idle = func(bool) { idles.Add(1) }
	listening := make(chan struct{}, 1)
	r.hooks.listening = func() { notify(listening) }
	start(t, r)
	testenv.WaitChan(t, listening, "the relay's LISTEN")
	// The wake-up LISTEN sends on connecting has been answered: both lanes
	// wait idle, so the first row wakes one of them and the second the
	// other, not a lane already on its way to a claim.
	testenv.WaitFor(t, "both lanes idle", func() bool {
		return idles.Load() >= 3 && len(r.wake) == 0 && r.inFlight.Load() == 0
	})
	for range 2 { // gathers before the first row are not the one asserted
		select {
		case <-gathered:
		default:
		}
	}
	enqueue(t, b.pool, msgTo(b.queue, "first"))
	waitAllSent(t, b.pool, 2)
}

// TestFailedMarkRollsBackAndRetries makes the mark fail once: the batch
// rolls back (its rows stay pending) and the
// next batch publishes the rows again and marks them.
func TestFailedMarkRollsBackAndRetries(t *testing.T) {
	t.Parallel()
	b, tc := tracedBundle(t)
	ctx := t.Context()
	_, err := b.pool.Exec(ctx, `
CREATE TABLE fail_mark (armed bool NOT NULL);
INSERT INTO fail_mark VALUES (true);
CREATE FUNCTION fail_mark_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.sent_at IS NOT NULL AND (SELECT armed FROM fail_mark) THEN
		RAISE EXCEPTION 'injected mark failure';
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER fail_mark BEFORE UPDATE ON inboxmq_outbox FOR EACH ROW EXECUTE FUNCTION fail_mark_once();`)
	require.NoError(t, err)
	enqueue(t, b.pool, msgTo(b.queue, "fail-1"), msgTo(b.queue, "fail-2"))

	r, _ := b.newRelay(t, &Config{Concurrency: 1, Retention: -1})
	failed := make(chan struct{})
	var once sync.Once
	r.hooks.claimed = func(rows int) {
		if rows > 0 && tc.count("rollback") > 0 {
			once.Do(func() { close(failed) })
		}
	}
	start(t, r)
	testenv.WaitChan(t, failed, "a claim after the failed mark's rollback")
	require.Equal(t, 2, countRows(t, b.pool, "sent_at IS NULL"), "the failed mark left the rows pending")
	_, err = b.pool.Exec(ctx, "UPDATE fail_mark SET armed = false")
	require.NoError(t, err)
	waitAllSent(t, b.pool, 2)
	require.Positive(t, tc.count("update | commit"))
}

// TestIdleLaneClaimsWithoutGather checks that a lane woken from idle claims
// at once: rows enqueued one at a time, each while the lane waits with no
// wake-up pending, are all sent, and the lane gathers at most once per row.
// (Once, not never: a row's NOTIFY can reach the lane only after the lane,
// woken by something else, has already claimed that row; the wake-up
// pending after that batch then reads as a busy lane's. GatherDelay is
// short here so that such a gather ends within the test.)
func TestIdleLaneClaimsWithoutGather(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, _ := b.newRelay(t, &Config{Concurrency: 1, Retention: -1, GatherDelay: 100 * time.Millisecond, PollInterval: time.Hour})
	idle := make(chan bool, 16)
	r.hooks.idle = func(wakePending bool) { idle <- wakePending }
	var gathered atomic.Int64
	r.hooks.gather = func() { gathered.Add(1) }
	// The LISTEN connection wakes every lane once it is up (rows may have
	// come meanwhile): wait for it first, or that wake-up can land just
	// after the lane claimed the first row and read as a busy lane's.
	listening := make(chan struct{}, 1)
	r.hooks.listening = func() {
		select {
		case listening <- struct{}{}:
		default:
		}
	}
	start(t, r)
	select {
	case <-listening:
	case <-time.After(testenv.Timeout()):
		t.Fatal("timed out waiting for the relay's LISTEN")
	}
	for i := range 3 {
		for pending := true; pending; {
			select {
			case pending = <-idle:
			case <-time.After(testenv.Timeout()):
				t.Fatal("timed out waiting for the lane to go idle")
			}
		}
		enqueue(t, b.pool, msgTo(b.queue, fmt.Sprintf("idle-%d", i)))
		waitAllSent(t, b.pool, i+1)
	}
	require.LessOrEqual(t, gathered.Load(), int64(3), "gathers: at most one per row")
}

// A database outage grows a lane's backoff; a row enqueued once the
// database answers again ends that wait at once (its NOTIFY wakes the
// lane), instead of waiting out the backoff (here an hour).
func TestDatabaseOutageEndsOnTheNextRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, _ := b.newRelay(t, &Config{Concurrency: 1, Retention: -1, PollInterval: time.Hour,
		ReconnectMinDelay: time.Hour, ReconnectMaxDelay: time.Hour})
	logger, rec := logtest.New(slog.LevelDebug)
	r.log = logger
	_, err := b.pool.Exec(t.Context(), `ALTER TABLE inboxmq_outbox RENAME TO inboxmq_outbox_away`)
	require.NoError(t, err)
	start(t, r)
	testenv.WaitFor(t, "a failed batch", func() bool { return rec.Count("outbox relay: batch failed") > 0 })
	_, err = b.pool.Exec(t.Context(), `ALTER TABLE inboxmq_outbox_away RENAME TO inboxmq_outbox`)
	require.NoError(t, err)
	enqueue(t, b.pool, msgTo(b.queue, "after-the-outage"))
	waitAllSent(t, b.pool, 1)
}
