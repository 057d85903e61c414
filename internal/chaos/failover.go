package chaos

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// failover is the fault phase of a run with a Failover: once the backlog
// is published and Failover.After of the orders have their ledger entry,
// it scrapes the workers, injects the fault and records it. The stall is
// measured after the drain (measureStall), from the ledger's timestamps.
func (r *scenarioRun) failover(ctx context.Context, exp Expect, pubErr <-chan error) error {
	f := r.cfg.Failover
	select {
	case err := <-pubErr:
		if err != nil {
			return err
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	want := int(math.Ceil(f.After * float64(len(exp.Orders))))
	deadline := time.Now().Add(r.cfg.DrainTimeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for n := r.ledgerCount(ctx); n < want; n = r.ledgerCount(ctx) {
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: %s: %d of %d orders had their ledger entry after %s: the workers are not draining (logs %s)",
				f.Name, n, want, r.cfg.DrainTimeout, r.rep.LogDir)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	r.scrapeAll(ctx)
	r.rep.SeriesBefore = r.seriesSum()
	done := r.ledgerCount(ctx)
	ev := FaultEvent{At: time.Since(r.start), Kind: f.Name, Worker: -1, Pending: len(exp.Orders) - done}
	fmt.Fprintf(r.cfg.Log, "chaos: %6.1fs %s: injecting with %d of %d orders done\n", ev.At.Seconds(), f.Name, done, len(exp.Orders))
	r.faultStart = time.Now()
	detail, err := f.Inject(ctx, FailoverRun{Queue: r.queue, RunID: r.runID, Redis: r.rdb})
	r.faultEnd = time.Now()
	ev.Took, ev.Detail = r.faultEnd.Sub(r.faultStart), detail
	if err != nil {
		ev.Err = err.Error()
	}
	r.rep.Faults = append(r.rep.Faults, ev)
	fmt.Fprintf(r.cfg.Log, "chaos: %6.1fs %s: %s (took %s) %s\n", time.Since(r.start).Seconds(), f.Name, detail, ev.Took.Round(time.Millisecond), ev.Err)
	if err != nil {
		return fmt.Errorf("chaos: inject %s: %w", f.Name, err)
	}
	// A worker that exited is a violation: heal, which comes next, says so.
	return nil
}

// tailShare is the share of the orders after whose ledger entry the stall
// is no longer measured: the last few orders can wait for something else
// than the fault (a claim's lease after a failed completion), and a gap
// before them says nothing about consumption.
const tailShare = 0.95

// measureStall fills the Failover's event with how long consumption
// stopped, from the ledger's timestamps (each entry's transaction start):
// the longest gap between entries from the fault's start until 95 % of the
// orders had their entry, the time from the fault's end to the first entry
// after it, how long the last 5 % took, and the rates before and after.
func (r *scenarioRun) measureStall(ctx context.Context) {
	if len(r.rep.Faults) == 0 || r.faultStart.IsZero() {
		return
	}
	ev := &r.rep.Faults[len(r.rep.Faults)-1]
	rows, err := r.pool.Query(ctx, `SELECT min(created_at) FROM ledger_entries GROUP BY order_id ORDER BY 1`)
	if err != nil {
		r.violate("measure the stall: %v", err)
		return
	}
	var stamps []time.Time
	for rows.Next() {
		var ts time.Time
		if err := rows.Scan(&ts); err != nil {
			rows.Close()
			r.violate("measure the stall: %v", err)
			return
		}
		stamps = append(stamps, ts)
	}
	rows.Close()
	if len(stamps) == 0 {
		return
	}
	tailStart := stamps[min(len(stamps), int(math.Ceil(tailShare*float64(r.rep.Orders))))-1]
	window := min(5*time.Second, r.faultStart.Sub(r.start))
	var before, after, steady int
	prev := r.faultStart
	for _, ts := range stamps {
		switch {
		case ts.Before(r.faultStart):
			if !ts.Before(r.faultStart.Add(-window)) {
				before++
			}
			continue
		case !ts.After(tailStart):
			ev.Stall = max(ev.Stall, ts.Sub(prev))
			prev = ts
		}
		if !ts.Before(r.faultEnd) {
			if after == 0 {
				ev.Recovery = ts.Sub(r.faultEnd)
			}
			after++
			if !ts.After(tailStart) {
				steady++
			}
		}
	}
	ev.Tail = stamps[len(stamps)-1].Sub(tailStart)
	if window > 0 {
		ev.RateBefore = float64(before) / window.Seconds()
	}
	if d := tailStart.Sub(r.faultEnd); steady > 1 && d > 0 {
		ev.RateAfter = float64(steady) / d.Seconds()
	}
	fmt.Fprintf(r.cfg.Log, "chaos: %s: consumption stopped for at most %s; first entry %s after the fault ended; the last 5 %% of the orders took %s; %.0f/s before, %.0f/s after\n",
		ev.Kind, ev.Stall.Round(10*time.Millisecond), ev.Recovery.Round(10*time.Millisecond), ev.Tail.Round(10*time.Millisecond), ev.RateBefore, ev.RateAfter)
	if after == 0 {
		fmt.Fprintf(r.cfg.Log, "chaos: %s: the backlog ran out before the fault ended: its stall covers only the part with work left\n", ev.Kind)
	}
}

// seriesSum sums the workers' last scraped series.
func (r *scenarioRun) seriesSum() map[string]float64 {
	out := make(map[string]float64)
	for _, w := range r.workers {
		for k, v := range w.scrape.currentSeries() {
			out[k] += v
		}
	}
	return out
}

// MetricChanges lists what the workers' metrics showed across a Failover,
// one line per series that changed between SeriesBefore and SeriesAfter:
// counters as `name{labels} +n`, gauges as `name{labels} a → b`. Durations
// (_sum series) are left out. Nil without a Failover.
func (s *ScenarioReport) MetricChanges() []string {
	if s.SeriesBefore == nil || s.SeriesAfter == nil {
		return nil
	}
	var out []string
	for k, after := range s.SeriesAfter {
		name, _, _ := strings.Cut(k, "{")
		before := s.SeriesBefore[k]
		if after == before || strings.HasSuffix(name, "_sum") {
			continue
		}
		if strings.HasSuffix(name, "_total") || strings.HasSuffix(name, "_count") {
			out = append(out, fmt.Sprintf("%s %+.0f", k, after-before))
		} else {
			out = append(out, fmt.Sprintf("%s %g → %g", k, before, after))
		}
	}
	for k, before := range s.SeriesBefore {
		if _, ok := s.SeriesAfter[k]; !ok {
			out = append(out, fmt.Sprintf("%s %g → absent", k, before))
		}
	}
	slices.Sort(out)
	return out
}

// MetricDelta returns how much the series named key (as in SeriesBefore)
// grew across the Failover, summed over every series whose key starts with
// key: MetricDelta("job_retry_total") counts every reason.
func (s *ScenarioReport) MetricDelta(key string) float64 {
	var d float64
	for k, v := range s.SeriesAfter {
		if k == key || strings.HasPrefix(k, key+"{") {
			d += v - s.SeriesBefore[k]
		}
	}
	return d
}
