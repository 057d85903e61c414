package inbox_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/startstop"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// seedCompleted inserts n completed rows of namespace whose completed_at is
// age ago.
func seedCompleted(t testing.TB, pool *pgxpool.Pool, namespace string, n int, age time.Duration) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `INSERT INTO inboxmq_inbox (consumer, key, status, completed_at)
		SELECT $1, $1 || ':' || g, 'completed', now() - $3::bigint * interval '1 microsecond'
		FROM generate_series(1, $2) g`, namespace, n, age.Microseconds())
	require.NoError(t, err)
}

func countRows(t testing.TB, pool *pgxpool.Pool, where string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM inboxmq_inbox WHERE `+where, args...).Scan(&n))
	return n
}

func newRetention(t *testing.T, pool *pgxpool.Pool, cfg *inbox.RetentionConfig) *inbox.Retention {
	t.Helper()
	s, err := inbox.NewStore(pool, nil)
	if err == nil {
		err = s.Check(t.Context())
	}
	require.NoError(t, err)
	r, err := inbox.NewRetention(s, cfg)
	require.NoError(t, err)
	return r
}

func TestRetention_DeletesOnlyExpiredCompletedRowsInBatches(t *testing.T) {
	t.Parallel()
	skipPartitioned(t)
	pool, _ := pgtest.Schema(t)
	seedCompleted(t, pool, "old", 250, 48*time.Hour)
	seedCompleted(t, pool, "young", 40, time.Hour)
	// Old rows that are not completed are never touched.
	_, err := pool.Exec(t.Context(), `INSERT INTO inboxmq_inbox (consumer, key, status, updated_at, first_seen_at)
		VALUES ('old', 'failed:1', 'failed', now() - interval '30 days', now() - interval '30 days'),
		       ('old', 'claim:1', 'processing', now() - interval '30 days', now() - interval '30 days')`)
	require.NoError(t, err)

	r := newRetention(t, pool, &inbox.RetentionConfig{Window: 24 * time.Hour, BatchSize: 100, BatchDelay: -1})
	run, err := r.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, inbox.RetentionRun{Deleted: 250, Batches: 3}, run)
	require.Zero(t, countRows(t, pool, `status = 'completed' AND consumer = 'old'`))
	require.Equal(t, 40, countRows(t, pool, `consumer = 'young'`))
	require.Equal(t, 2, countRows(t, pool, `consumer = 'old'`))

	run, err = r.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, inbox.RetentionRun{Batches: 1}, run)
}

func TestRetention_MaxBatches(t *testing.T) {
	t.Parallel()
	skipPartitioned(t)
	pool, _ := pgtest.Schema(t)
	seedCompleted(t, pool, "c", 50, 48*time.Hour)
	r := newRetention(t, pool, &inbox.RetentionConfig{Window: time.Hour, BatchSize: 10, MaxBatches: 2, BatchDelay: -1})
	run, err := r.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, inbox.RetentionRun{Deleted: 20, Batches: 2}, run)
	require.Equal(t, 30, countRows(t, pool, "true"))

	run, err = r.PurgeBefore(t.Context(), time.Now())
	require.NoError(t, err)
	require.Equal(t, int64(20), run.Deleted)
}

// Only one process runs retention on a table at a time.
func TestRetention_SkipsWhileAnotherHoldsTheLock(t *testing.T) {
	t.Parallel()
	skipPartitioned(t)
	pool, _ := pgtest.Schema(t)
	seedCompleted(t, pool, "c", 10, 48*time.Hour)
	r := newRetention(t, pool, &inbox.RetentionConfig{Window: time.Hour})

	conn, err := pool.Acquire(t.Context())
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(t.Context(), `SELECT pg_advisory_lock((hashtext('inboxmq_retention')::bigint << 32) | to_regclass('inboxmq_inbox')::oid::bigint)`)
	require.NoError(t, err)

	run, err := r.RunOnce(t.Context())
	require.NoError(t, err)
	require.True(t, run.Skipped)
	require.Equal(t, 10, countRows(t, pool, "true"))

	_, err = conn.Exec(t.Context(), `SELECT pg_advisory_unlock_all()`)
	require.NoError(t, err)
	run, err = r.RunOnce(t.Context())
	require.NoError(t, err)
	require.False(t, run.Skipped)
	require.Equal(t, int64(10), run.Deleted)
}

// Retention runs while workers keep inserting and completing rows: no
// deadlock, no error, expired rows go, rows inside the window stay.
func TestRetention_WithConcurrentInserters(t *testing.T) {
	t.Parallel()
	skipPartitioned(t)
	pool, _ := pgtest.Schema(t)
	seedCompleted(t, pool, "old", 3000, 72*time.Hour)
	r := newRetention(t, pool, &inbox.RetentionConfig{Window: 24 * time.Hour, BatchSize: 200, BatchDelay: -1})

	ctx := t.Context()
	var stop atomic.Bool
	var inserted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				// An insert and a completion, like the inbox's claim.
				_, err := pool.Exec(ctx, `INSERT INTO inboxmq_inbox (consumer, key, status, completed_at)
					VALUES ('new', $1, 'completed', now()) ON CONFLICT DO NOTHING`, fmt.Sprintf("w%d:%d", w, i))
				if err != nil {
					errs <- err
					return
				}
				inserted.Add(1)
			}
		})
	}
	// Let the inserters get going before and during the run.
	testenv.WaitFor(t, "inserters running", func() bool { return inserted.Load() >= 20 })
	run, err := r.RunOnce(t.Context())
	stop.Store(true)
	wg.Wait()
	close(errs)
	require.NoError(t, err)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int64(3000), run.Deleted)
	require.Zero(t, countRows(t, pool, `consumer = 'old'`))
	require.Equal(t, int(inserted.Load()), countRows(t, pool, `consumer = 'new'`))
}

func TestRetention_StartStop(t *testing.T) {
	t.Parallel()
	skipPartitioned(t)
	pool, _ := pgtest.Schema(t)
	seedCompleted(t, pool, "c", 5, 48*time.Hour)
	r := newRetention(t, pool, &inbox.RetentionConfig{Window: time.Hour, Interval: time.Hour})
	require.NoError(t, r.Stop(t.Context()), "Stop without Start")
	ctx, cancel := context.WithCancel(t.Context())
	require.NoError(t, r.Start(ctx))
	cancel() // ctx bounds only the start
	require.ErrorIs(t, r.Start(t.Context()), startstop.ErrAlreadyStarted)
	// The first run happens at once.
	testenv.WaitFor(t, "expired rows deleted", func() bool { return countRows(t, pool, "true") == 0 })
	stopped := r.Stopped()
	require.NoError(t, r.Stop(t.Context()))
	select {
	case <-stopped:
	default:
		t.Fatal("Stop returned before the job ended")
	}
	require.NoError(t, r.Stop(t.Context()), "Stop twice")
}

func TestCheckWindow(t *testing.T) {
	t.Parallel()
	horizon := inbox.RedeliveryHorizon(10*time.Minute, 5, 72*time.Hour)
	require.Equal(t, 72*time.Hour+50*time.Minute, horizon)
	for _, tc := range []struct {
		name    string
		window  time.Duration
		horizon time.Duration
		ok      bool
	}{
		{"default window covers a 3-day replay window", inbox.DefaultRetentionWindow, horizon, true},
		{"shorter than the horizon", 72 * time.Hour, horizon, false},
		{"equal", horizon, horizon, true},
		{"no horizon configured", time.Minute, 0, true},
		{"non-positive window", 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := inbox.CheckWindow(tc.window, tc.horizon)
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
			}
		})
	}
	require.ErrorIs(t, inbox.CheckWindow(time.Hour, 2*time.Hour), inbox.ErrWindowTooShort)
}

// The start-up check trips when the configured window is too short.
func TestNewRetention_RefusesWindowShorterThanHorizon(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Schema(t)
	s, err := inbox.NewStore(pool, nil)
	if err == nil {
		err = s.Check(t.Context())
	}
	require.NoError(t, err)
	_, err = inbox.NewRetention(s, &inbox.RetentionConfig{
		Window:            time.Hour,
		RedeliveryHorizon: inbox.RedeliveryHorizon(2*time.Minute, 20, time.Hour),
	})
	require.ErrorIs(t, err, inbox.ErrWindowTooShort)
}

// The dedup window must cover every way a copy can come back: broker
// retries and the time operators take to replay the DLQ.
func ExampleCheckWindow() {
	horizon := inbox.RedeliveryHorizon(10*time.Minute, 5, 72*time.Hour) // 5 retries ≤ 10m, replay within 3 days
	fmt.Println(horizon)
	fmt.Println(inbox.CheckWindow(inbox.DefaultRetentionWindow, horizon))
	fmt.Println(inbox.CheckWindow(24*time.Hour, horizon))
	// Output:
	// 72h50m0s
	// <nil>
	// inbox: retention window shorter than the redelivery horizon: window 24h0m0s < horizon 72h50m0s (max retry delay × attempts + DLQ replay window)
}

// BenchmarkInboxInsert measures single-row inbox inserts (one autocommit
// transaction each, like a per-message claim) on an inbox that already
// holds 0 or 1M rows, with and without the retention job deleting expired
// rows alongside. The preloaded rows' completed_at spread over the last 8
// days, so with a 7-day window about an eighth of them are expired and the
// job has work while the inserts run. Set INBOXMQ_BENCH_ROWS=10000000 for
// the 10M case.
func BenchmarkInboxInsert(b *testing.B) {
	sizes := []int{0, 1_000_000}
	if s := os.Getenv("INBOXMQ_BENCH_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(b, err)
		sizes = []int{n}
	}
	var seq atomic.Int64
	for _, rows := range sizes {
		// One preloaded schema per size, shared by both variants and every
		// b.N round (a 10M preload takes minutes): cleanup=false runs first.
		pool, _ := pgtest.SchemaWith(b, 16)
		ctx := context.Background()
		if rows > 0 {
			_, err := pool.Exec(ctx, `INSERT INTO inboxmq_inbox (consumer, key, status, fingerprint, attempts, completed_at)
				SELECT 'bench', 'seed:' || g, 'completed', sha256(g::text::bytea), 1,
				       now() - (g % 11520) * interval '1 minute'
				FROM generate_series(1, $1) g`, rows)
			require.NoError(b, err)
			_, err = pool.Exec(ctx, `VACUUM ANALYZE inboxmq_inbox`)
			require.NoError(b, err)
		}
		for _, cleanup := range []bool{false, true} {
			b.Run(fmt.Sprintf("rows=%d/cleanup=%v", rows, cleanup), func(b *testing.B) {
				s, err := inbox.NewStore(pool, nil)
				if err == nil {
					err = s.Check(ctx)
				}
				require.NoError(b, err)
				r, err := inbox.NewRetention(s, &inbox.RetentionConfig{Window: 7 * 24 * time.Hour, Interval: 50 * time.Millisecond, MaxBatches: 5}) // short runs: the work spreads over the measurement
				require.NoError(b, err)
				var deleted atomic.Int64
				stop := make(chan struct{})
				done := make(chan struct{})
				go func() {
					defer close(done)
					for cleanup {
						select {
						case <-stop:
							return
						default:
						}
						run, err := r.RunOnce(ctx)
						if err != nil {
							b.Error(err)
							return
						}
						deleted.Add(run.Deleted)
						if run.Deleted == 0 {
							select {
							case <-stop:
								return
							case <-time.After(50 * time.Millisecond):
							}
						}
					}
				}()
				b.SetParallelism(4)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						k := "k:" + strconv.FormatInt(seq.Add(1), 10)
						_, err := pool.Exec(ctx, `INSERT INTO inboxmq_inbox (consumer, key, status, fingerprint, attempts, completed_at)
							VALUES ('bench', $1::text, 'completed', sha256(convert_to($1::text, 'UTF8')), 1, now()) ON CONFLICT DO NOTHING`, k)
						if err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.StopTimer()
				close(stop)
				<-done
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "inserts/s")
				var table, indexes int64
				require.NoError(b, pool.QueryRow(ctx, `SELECT pg_relation_size('inboxmq_inbox'), pg_indexes_size('inboxmq_inbox')`).Scan(&table, &indexes))
				b.ReportMetric(float64(table)/(1<<20), "table_MiB")
				b.ReportMetric(float64(indexes)/(1<<20), "index_MiB")
				b.ReportMetric(float64(deleted.Load()), "deleted")
			})
		}
	}
}
