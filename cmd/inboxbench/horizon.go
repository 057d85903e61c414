package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/inboxmq/inboxmq/internal/consumer"
)

// Case (pgx) and the critical-time run.

// horizonNotes collects what (pgx)'s drains and latency runs saw of the
// tables' dead tuples.
var horizonNotes notes

type notes struct {
	mu            sync.Mutex
	inbox, outbox []string // "before→after", per run
}

func (n *notes) add(inbox0, inbox1, outbox0, outbox1 int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.inbox = append(n.inbox, fmt.Sprintf("%d→%d", inbox0, inbox1))
	n.outbox = append(n.outbox, fmt.Sprintf("%d→%d", outbox0, outbox1))
}

func (n *notes) lines() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.inbox) == 0 {
		return nil
	}
	return []string{fmt.Sprintf("(pgx) dead tuples while the horizon was pinned, per run (drains, then latency runs): inbox %s; outbox %s",
		strings.Join(n.inbox, " "), strings.Join(n.outbox, " "))}
}

// criticalLine is the critical-time run's report line.
var criticalLine string

// deadTuplesSQL reads the dead tuples of the inbox and the outbox, as the
// statistics collector last heard of them.
const deadTuplesSQL = `SELECT coalesce(sum(n_dead_tup) FILTER (WHERE relname = 'inboxmq_inbox'), 0),
       coalesce(sum(n_dead_tup) FILTER (WHERE relname = 'inboxmq_outbox'), 0)
FROM pg_stat_user_tables WHERE schemaname = $1`

// pinned runs inner while another session holds a transaction open, with
// a transaction id and a snapshot: PostgreSQL can remove no row version
// that died after it began, in any table, until it ends — a long report
// query or a forgotten psql session. It notes the inbox's and outbox's
// dead tuples at the start and at the end of the run.
func (e *env) pinned(inner runner) runner {
	return func(ctx context.Context, queue string, done func(time.Time)) (func() error, error) {
		conn, err := e.admin.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		var xid int64
		if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ"); err != nil {
			conn.Release()
			return nil, err
		}
		if err := conn.QueryRow(ctx, "SELECT txid_current()").Scan(&xid); err != nil {
			conn.Release()
			return nil, err
		}
		var inbox0, outbox0 int64
		if err := e.admin.QueryRow(ctx, deadTuplesSQL, e.schema).Scan(&inbox0, &outbox0); err != nil {
			conn.Release()
			return nil, err
		}
		stop, err := inner(ctx, queue, done)
		if err != nil {
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
			conn.Release()
			return nil, err
		}
		return func() error {
			err := stop()
			// The backends report their counts at most once a second.
			time.Sleep(1100 * time.Millisecond)
			var inbox1, outbox1 int64
			if qerr := e.admin.QueryRow(context.Background(), deadTuplesSQL, e.schema).Scan(&inbox1, &outbox1); qerr == nil {
				horizonNotes.add(inbox0, inbox1, outbox0, outbox1)
			}
			_, _ = conn.Exec(context.Background(), "ROLLBACK")
			conn.Release()
			return err
		}, nil
	}
}

// criticalTime runs case (p) — the payment chain at the payment-worker's
// defaults — at a steady rate for dur and reads the worker's
// inboxmq_critical_time_seconds histogram (publication, per the
// producer's x-published-at, to the effect's commit): its p50 and p99,
// interpolated within the buckets, beside the same percentiles from the
// benchmark's own clock, and the p99 the buckets before 2026-12-06 night
// (one from 25 to 50 ms) would have given. With ceiling set, (p)'s
// ceiling — the chain by hand, case (pc) — then runs at the same rate for
// as long, timed by the benchmark's clock: the tail this machine gives
// the same work without the framework.
func criticalTime(ctx context.Context, e *env, rate float64, dur time.Duration, ceiling bool) (string, error) {
	c := benchCase{id: "p", queueType: consumer.Classic, run: chainCase(e, consumer.Classic, nil, e.workers, false)}
	p50, p99, err := latency(ctx, e, c, rate, dur)
	reg := e.registry.Load()
	if reg == nil {
		return "", fmt.Errorf("no worker registry: %w", err)
	}
	mfs, gerr := reg.Gather()
	if gerr != nil {
		return "", gerr
	}
	var h *dto.Histogram
	for _, mf := range mfs {
		if mf.GetName() == "inboxmq_critical_time_seconds" && len(mf.GetMetric()) > 0 {
			h = mf.GetMetric()[0].GetHistogram()
		}
	}
	if h == nil || h.GetSampleCount() == 0 {
		return "", fmt.Errorf("no critical time observed: %w", err)
	}
	ms := func(h *dto.Histogram, q float64) float64 { return 1000 * histogramQuantile(h, q) }
	line := fmt.Sprintf("critical time at %.0f msg/s: p50 %.1f ms p99 %.1f ms (the histogram, %d jobs in %s; the benchmark's clock: p50 %.1f ms, p99 %.1f ms; the buckets before 2026-12-06 night: p99 %.1f ms",
		rate, ms(h, 0.5), ms(h, 0.99), h.GetSampleCount(), dur, millis(p50), millis(p99), ms(coarse(h), 0.99))
	if ceiling {
		pc := benchCase{id: "pc", queueType: consumer.Classic, run: chainLoop(e, e.workers)}
		c50, c99, cerr := latency(ctx, e, pc, rate, dur)
		if cerr != nil {
			err = errors.Join(err, fmt.Errorf("(pc) at the same rate: %w", cerr))
		}
		line += fmt.Sprintf("; (pc), the chain by hand, at the same rate by the benchmark's clock: p50 %.1f ms, p99 %.1f ms", millis(c50), millis(c99))
	}
	return line + ")", err
}

// millis is d in milliseconds, to the microsecond.
func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// coarseBounds are the critical-time buckets up to 1 s before 2026-12-06
// night, when buckets at 15, 20, 30, 40 and 75 ms were added.
var coarseBounds = []float64{.005, .01, .025, .05, .1, .25, .5, 1}

// coarse is h with only the buckets it had before 2026-12-06 night up to
// 1 s (and every one above): the p99 those buckets would have given.
func coarse(h *dto.Histogram) *dto.Histogram {
	out := &dto.Histogram{SampleCount: h.SampleCount, SampleSum: h.SampleSum}
	for _, b := range h.GetBucket() {
		if ub := b.GetUpperBound(); ub > 1 || slices.Contains(coarseBounds, ub) {
			out.Bucket = append(out.Bucket, b)
		}
	}
	return out
}

// histogramQuantile is Prometheus's histogram_quantile on one histogram:
// linear within the bucket the quantile falls in, from 0 in the first.
func histogramQuantile(h *dto.Histogram, q float64) float64 {
	buckets := h.GetBucket()
	sort.Slice(buckets, func(i, j int) bool { return buckets[i].GetUpperBound() < buckets[j].GetUpperBound() })
	rank := q * float64(h.GetSampleCount())
	lower, below := 0.0, 0.0
	for _, b := range buckets {
		upper, count := b.GetUpperBound(), float64(b.GetCumulativeCount())
		if count >= rank {
			if math.IsInf(upper, 1) || count == below {
				return lower
			}
			return lower + (upper-lower)*(rank-below)/(count-below)
		}
		lower, below = upper, count
	}
	return lower
}
