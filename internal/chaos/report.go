package chaos

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteTable prints the report: one row per scenario with its figures, one
// row per fault kind with its recovery times, and every violation.
func (r *Report) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "\ninboxchaos seed %d\n\n", r.Seed)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\torders\tpublishes\tdup copies\tpoison+declined\tfaults\tdup absorbed (by source)\tgateway calls above 1/key\tretries\tdrain\tresult\t")
	for _, s := range r.Scenarios {
		copies := s.Publishes - s.Orders - s.Declined - s.Poison
		extra := "-"
		if s.Check != nil && s.Name == ScenarioGateway {
			extra = fmt.Sprint(s.Check.ExtraCalls)
		}
		result := "PASS"
		if len(s.Violations) > 0 {
			result = fmt.Sprintf("FAIL (%d)", len(s.Violations))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%.0f\t%s\t%s\t\n", s.Name, s.Orders, s.Publishes, copies,
			s.Poison+s.Declined, len(s.Faults), dupSources(s.Metrics), extra, s.Metrics["job_retry_total"],
			s.Drain.Round(100*time.Millisecond), result)
	}
	_ = tw.Flush()

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tfault\tcount\trecovery p50\trecovery max\terrors\t")
	for _, s := range r.Scenarios {
		byKind := map[string][]time.Duration{}
		errs := map[string]int{}
		for _, f := range s.Faults {
			if f.Err != "" {
				errs[f.Kind]++
				continue
			}
			byKind[f.Kind] = append(byKind[f.Kind], f.Recovery)
		}
		kinds := make([]string, 0, len(byKind))
		for k := range byKind {
			kinds = append(kinds, k)
		}
		for k := range errs {
			if !slices.Contains(kinds, k) {
				kinds = append(kinds, k)
			}
		}
		sort.Strings(kinds)
		for _, k := range kinds {
			ds := byKind[k]
			p50, mx := "-", "-"
			if len(ds) > 0 && k != FaultGatewaySlow && k != FaultGatewayFail {
				p50 = percentile(ds, 0.5).Round(time.Millisecond).String()
				mx = percentile(ds, 1).Round(time.Millisecond).String()
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t\n", s.Name, k, len(ds)+errs[k], p50, mx, errs[k])
		}
	}
	_ = tw.Flush()

	for _, s := range r.Scenarios {
		if s.SeriesBefore == nil {
			continue
		}
		for _, f := range s.Faults {
			fmt.Fprintf(w, "\n%s %s: %s; took %s with %d of %d orders pending; consumption stopped for at most %s; first ledger entry %s after it ended; last 5 %% of the orders in %s; %.0f/s before, %.0f/s after\n",
				s.Name, f.Kind, f.Detail, f.Took.Round(time.Millisecond), f.Pending, s.Orders, f.Stall.Round(10*time.Millisecond),
				f.Recovery.Round(10*time.Millisecond), f.Tail.Round(10*time.Millisecond), f.RateBefore, f.RateAfter)
		}
		fmt.Fprintf(w, "retries scheduled in the outbox: %d, %d of them published more than %s after their due time (the latest %s after)\n",
			s.Retries, s.RetriesLate, RetryLateBound, s.RetryLateMax.Round(10*time.Millisecond))
		fmt.Fprintf(w, "metrics from the fault's start to the drain, summed over the workers:\n")
		for _, line := range s.MetricChanges() {
			fmt.Fprintf(w, "  %s\n", line)
		}
	}
	for _, s := range r.Scenarios {
		for _, v := range s.Violations {
			fmt.Fprintf(w, "VIOLATION %s: %s\n", s.Name, v)
		}
		for _, f := range s.Faults {
			if f.Err != "" {
				fmt.Fprintf(w, "fault error %s: %s on worker %d at %.1fs: %s\n", s.Name, f.Kind, f.Worker, f.At.Seconds(), f.Err)
			}
		}
		if len(s.Violations) > 0 {
			fmt.Fprintf(w, "worker logs of %s: %s\n", s.Name, s.LogDir)
		}
	}
	if r.OK() {
		fmt.Fprintf(w, "\nPASS (seed %d)\n", r.Seed)
	} else {
		fmt.Fprintf(w, "\nFAIL (seed %d): replay with -seed %d\n", r.Seed, r.Seed)
	}
}

// dupSources formats the duplicate counters by source: "41 (inbox 30, cache 11)".
func dupSources(m map[string]float64) string {
	total, ok := m["duplicate_detected_total"]
	if !ok {
		return "n/a"
	}
	var parts []string
	for k, v := range m {
		if src, found := strings.CutPrefix(k, "duplicate_detected_total/"); found && v > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f", src, v))
		}
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return fmt.Sprintf("%.0f", total)
	}
	return fmt.Sprintf("%.0f (%s)", total, strings.Join(parts, ", "))
}
