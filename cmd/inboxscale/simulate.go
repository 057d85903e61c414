package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/migrations"
)

// simulate runs the retention simulation: a 7-day window at a steady
// 1,000 msg/s scaled by -sim-scale, then -sim-hours simulated hours of
// steady state, each one's rows inserted (completed at times inside that
// hour) and followed by one retention pass with that hour's cut-off. The
// simulated clock is the real clock of the last 7 days + sim-hours, so the
// partitions are real ones; what is compressed is the wall time: an hour's
// inserts and retention run back to back, and autovacuum (whose naptime is
// real time) sees a week of churn in minutes.
func simulate(ctx context.Context, base *pgxpool.Config, o options) error {
	perHour := int64(3_600_000 * o.simScale)
	fmt.Printf("\n== retention over a simulated week: 1,000 msg/s × %.3f = %d rows per simulated hour, window 7 days, %d steady hours ==\n",
		o.simScale, perHour, o.simHours)
	end := time.Now().Truncate(time.Hour)
	t0 := end.Add(-time.Duration(o.simHours) * time.Hour)
	var sims []*table
	for _, name := range []string{"sim_plain", "sim_partitioned"} {
		var pc *migrations.PartitionConfig
		if name == "sim_partitioned" {
			pc = &migrations.PartitionConfig{Width: o.width, Ahead: 3}
		}
		t, err := newTable(ctx, base, name, pc)
		if err != nil {
			return err
		}
		defer t.pool.Close()
		if t.part != nil {
			if err := migrations.CreatePartitions(ctx, t.pool, t.part, t0.Add(-8*24*time.Hour)); err != nil {
				return err
			}
		}
		// The first 7 days, at once (bulk loaded like the claims' fill).
		week := perHour * 24 * 7
		st, err := t.bulkLoad(ctx, 1, week, o, func(ctx context.Context, lo, hi int64) error {
			return t.simInsert(ctx, lo, hi, 1, week, t0.Add(-7*24*time.Hour), t0)
		})
		if err != nil {
			return err
		}
		fmt.Printf("  (filled %s with the first 7 days, %d rows, in %s)\n", t.name, week, st.total().Round(time.Second))
		t.rows = week
		sims = append(sims, t)
	}
	type stats struct {
		passes      []time.Duration
		dead        []int64
		deleted     int64
		dropped     int
		autovacuums int64
	}
	st := make([]stats, len(sims))
	started := time.Now()
	for h := range o.simHours {
		from := t0.Add(time.Duration(h) * time.Hour)
		for i, t := range sims {
			if err := t.simInsert(ctx, t.rows+1, t.rows+perHour, t.rows+1, t.rows+perHour, from, from.Add(time.Hour)); err != nil {
				return err
			}
			t.rows += perHour
			r, err := inbox.NewRetention(t.store, &inbox.RetentionConfig{Window: 7 * 24 * time.Hour, BatchSize: 1000, BatchDelay: -1})
			if err != nil {
				return err
			}
			began := time.Now()
			run, err := r.PurgeBefore(ctx, from.Add(time.Hour).Add(-7*24*time.Hour))
			if err != nil {
				return err
			}
			st[i].passes = append(st[i].passes, time.Since(began))
			st[i].deleted += run.Deleted
			st[i].dropped += run.Partitions
			dead, _, _ := t.vacuumStats(ctx)
			st[i].dead = append(st[i].dead, dead)
		}
	}
	fmt.Printf("simulated %d hours in %s of wall time\n", o.simHours, time.Since(started).Round(time.Second))
	fmt.Printf("%-16s %12s %12s %12s %14s %14s %12s %10s %10s\n", "table", "pass mean", "pass max", "rows gone",
		"dead tup mean", "dead tup max", "autovacuums", "heap MB", "index MB")
	for i, t := range sims {
		_, av, _ := t.vacuumStats(ctx)
		heap, idx, parts := t.sizes(ctx)
		var sum time.Duration
		for _, d := range st[i].passes {
			sum += d
		}
		var deadSum int64
		for _, d := range st[i].dead {
			deadSum += d
		}
		n := max(len(st[i].passes), 1)
		gone := fmt.Sprint(st[i].deleted)
		if t.part != nil {
			gone = fmt.Sprintf("~%d (%dp)", st[i].deleted, st[i].dropped)
		}
		fmt.Printf("%-16s %12s %12s %12s %14d %14d %12d %10.0f %10.0f  (%d partitions)\n", t.name,
			(sum / time.Duration(n)).Round(time.Microsecond), slices.Max(append(st[i].passes, 0)).Round(time.Microsecond),
			gone, deadSum/int64(n), slices.Max(append(st[i].dead, 0)), av, mb(heap), mb(idx), parts)
	}
	fmt.Println("dead tup: n_dead_tup summed over the table's partitions after each hour's pass (pg_stat_user_tables; autovacuum runs meanwhile)")
	return nil
}

// simInsert inserts the rows lo..hi of the rows first..last, which are
// completed uniformly in [from, to) in their order.
func (t *table) simInsert(ctx context.Context, lo, hi, first, last int64, from, to time.Time) error {
	cols, vals := "", ""
	if t.part != nil {
		cols = ", bucket"
		vals = fmt.Sprintf(", date_bin(%d * interval '1 second', x.ts, '%s')",
			int64(t.part.Width/time.Second), t.part.Origin.Format(time.RFC3339))
	}
	_, err := t.pool.Exec(ctx, `INSERT INTO inboxmq_inbox (consumer, key, status, fingerprint, fence, attempts, message_id, completed_at, first_seen_at, updated_at`+cols+`)
SELECT 'bench', md5(g::text), 'completed', sha256('{}'::bytea), 1, 1, 'm-' || g, x.ts, x.ts, x.ts`+vals+`
FROM generate_series($1::bigint, $2::bigint) g,
	LATERAL (SELECT $3::timestamptz + ($4::timestamptz - $3::timestamptz) * ((g - $5)::float8 / ($6 - $5 + 1)) AS ts) x`,
		lo, hi, from, to, first, last)
	if err != nil {
		return fmt.Errorf("simulate %s: %w", t.name, err)
	}
	return nil
}

// vacuumStats sums n_dead_tup and autovacuum runs over the table's
// partitions.
func (t *table) vacuumStats(ctx context.Context) (dead, autovacuums, live int64) {
	_ = t.pool.QueryRow(ctx, `SELECT COALESCE(sum(n_dead_tup), 0)::bigint, COALESCE(sum(autovacuum_count), 0)::bigint, COALESCE(sum(n_live_tup), 0)::bigint
		FROM pg_stat_user_tables WHERE relid IN (SELECT 'inboxmq_inbox'::regclass UNION SELECT relid FROM pg_partition_tree('inboxmq_inbox'))`).
		Scan(&dead, &autovacuums, &live)
	return dead, autovacuums, live
}
