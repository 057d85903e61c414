package chaos

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ContractMetrics are the suffixes of the metric names the payment-worker
// contract says are exported from startup.
var ContractMetrics = []string{
	"duplicate_detected_total",
	"lock_acquire_success_total",
	"lock_acquire_failed_total",
	"lock_expired_before_completion_total",
	"job_retry_total",
	"job_processing_duration_seconds",
	"idempotency_conflict_total",
	"stale_processing_records_total",
}

// scraper keeps the last scraped counters of one worker slot, across
// restarts: a restart folds the last values of the previous process into
// the slot's total, so counts survive kills (up to one scrape interval).
type scraper struct {
	url string

	mu     sync.Mutex
	cur    map[string]float64
	done   map[string]float64
	seen   map[string]bool    // metric name suffixes seen (contract check)
	series map[string]float64 // the current process's series, see seriesKey
}

func newScraper(addr string) *scraper {
	return &scraper{url: "http://" + addr + "/metrics", cur: map[string]float64{}, done: map[string]float64{}, seen: map[string]bool{}}
}

// restarted folds the current process's counters into the total.
func (s *scraper) restarted() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range s.cur {
		s.done[k] += v
	}
	s.cur = map[string]float64{}
}

// totals returns done + cur.
func (s *scraper) totals() map[string]float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]float64, len(s.cur))
	for k, v := range s.done {
		out[k] += v
	}
	for k, v := range s.cur {
		out[k] += v
	}
	return out
}

// scrape fetches the metrics once; errors (a killed or stopped worker) leave
// the last values in place.
func (s *scraper) scrape(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	vals, names, series := parseMetrics(resp.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur, s.series = vals, series
	for n := range names {
		for _, c := range ContractMetrics {
			if strings.HasSuffix(n, c) || strings.HasSuffix(n, c+"_bucket") || strings.HasSuffix(n, c+"_count") {
				s.seen[c] = true
			}
		}
	}
	return true
}

// missing returns the contract metrics never seen in a scrape.
func (s *scraper) missing() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, c := range ContractMetrics {
		if !s.seen[c] {
			out = append(out, c)
		}
	}
	return out
}

// counted are the counters the report shows, by name suffix. Duplicates are
// also split by their source label.
var counted = []string{
	"duplicate_detected_total",
	"job_retry_total",
	"lock_acquire_success_total",
	"lock_acquire_failed_total",
	"lock_expired_before_completion_total",
	"idempotency_conflict_total",
	"stale_processing_records_total",
	processedMetric,
	reconnectsMetric,
	connectedMetric,
}

// reconnectsMetric and connectedMetric are the consumer's broker connection
// series; recovery from a closed connection is measured with them.
const (
	reconnectsMetric = "broker_reconnects_total"
	connectedMetric  = "broker_connected"
)

// current scrapes once and returns the current process's value of the
// counted series name (false if the scrape failed or the series is absent).
func (s *scraper) current(ctx context.Context, name string) (float64, bool) {
	if !s.scrape(ctx) {
		return 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.cur[name]
	return v, ok
}

// processedMetric counts the deliveries a worker process has finished
// handling (the histogram's count); recovery is measured with it.
const processedMetric = "job_processing_duration_seconds_count"

// processed scrapes once and returns the current process's count of
// handled deliveries (false if the scrape failed).
func (s *scraper) processed(ctx context.Context) (float64, bool) {
	if !s.scrape(ctx) {
		return 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur[processedMetric], true
}

// currentSeries returns a copy of the last scrape's series.
func (s *scraper) currentSeries() map[string]float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]float64, len(s.series))
	for k, v := range s.series {
		out[k] = v
	}
	return out
}

// parseMetrics reads the Prometheus text format and sums the counted
// series: "<suffix>" over all labels and "duplicate_detected_total/<source>"
// per source. It also returns every metric name seen, and every series of
// the worker's own metrics by seriesKey.
func parseMetrics(r io.Reader) (vals map[string]float64, names map[string]bool, series map[string]float64) {
	vals = make(map[string]float64)
	names = make(map[string]bool)
	series = make(map[string]float64)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		text, valStr := line[:sp], line[sp+1:]
		name, labels, _ := strings.Cut(text, "{")
		names[name] = true
		v, err := strconv.ParseFloat(valStr, 64)
		if err != nil {
			continue
		}
		if k, ok := seriesKey(name, labels); ok {
			series[k] += v
		}
		for _, c := range counted {
			if !strings.HasSuffix(name, c) {
				continue
			}
			vals[c] += v
			if c == "duplicate_detected_total" {
				vals[c+"/"+labelValue(labels, "source")] += v
			}
		}
	}
	return vals, names, series
}

// seriesKey names a series for the failover report: the metric name
// without the "inboxmq_" namespace, with its labels but queue and consumer
// (one run has one of each), as `job_retry_total{reason="db_connection"}`.
// The Go and process collectors and histogram buckets are left out (ok
// false).
func seriesKey(name, labels string) (string, bool) {
	for _, p := range []string{"go_", "process_", "promhttp_"} {
		if strings.HasPrefix(name, p) {
			return "", false
		}
	}
	if strings.HasSuffix(name, "_bucket") {
		return "", false
	}
	name = strings.TrimPrefix(name, "inboxmq_")
	var kept []string
	rest := strings.TrimSuffix(labels, "}")
	for rest != "" {
		eq := strings.Index(rest, `="`)
		if eq < 0 {
			break
		}
		key := strings.TrimPrefix(rest[:eq], ",")
		// The value ends at the first quote not escaped by a backslash.
		i := eq + 2
		for i < len(rest) && (rest[i] != '"' || rest[i-1] == '\\') {
			i++
		}
		if i >= len(rest) {
			break
		}
		if key != "queue" && key != "consumer" {
			kept = append(kept, strings.TrimPrefix(rest[:i+1], ","))
		}
		rest = rest[i+1:]
	}
	if len(kept) == 0 {
		return name, true
	}
	return name + "{" + strings.Join(kept, ",") + "}", true
}

// labelValue returns the value of label name in a `a="x",b="y"}` list.
func labelValue(labels, name string) string {
	var rest string
	if strings.HasPrefix(labels, name+`="`) {
		rest = labels[len(name)+2:]
	} else if i := strings.Index(labels, ","+name+`="`); i >= 0 {
		rest = labels[i+len(name)+3:]
	} else {
		return "unknown"
	}
	j := strings.IndexByte(rest, '"')
	if j < 0 {
		return "unknown"
	}
	return rest[:j]
}
