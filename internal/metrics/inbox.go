package metrics

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
)

// Inbox statuses: the bounded values of inbox_rows{status}. They match the
// CHECK constraint of the inboxmq_inbox table.
var inboxStatuses = []string{"received", "processing", "completed", "failed", "dead"}

// Querier is the one method of *pgxpool.Pool (or *pgx.Conn) the inbox
// gauges need.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// InboxConfig configures the inbox gauges, read from the inbox table when
// Prometheus scrapes.
type InboxConfig struct {
	// DB runs the query, typically the worker's *pgxpool.Pool. Required.
	DB Querier
	// Table is the inbox table, optionally schema-qualified ("ops.inbox").
	// Defaults to "inboxmq_inbox" (resolved through the search_path).
	Table string
	// Timeout bounds the query of one scrape; on timeout the gauges keep
	// their last values and inbox_scrape_success reads 0. Defaults to 2s.
	Timeout time.Duration
	// MinInterval is the shortest time between two queries: scrapes within
	// it reuse the last result, so several Prometheus servers or a short
	// scrape interval do not multiply the table scans. Defaults to 10s; -1
	// queries on every scrape.
	MinInterval time.Duration
}

type inboxRow struct {
	consumer, status string
	rows             float64
	oldestAge        float64
	expired          float64
}

type inboxCollector struct {
	cfg   InboxConfig
	query string

	rows, oldest, expired, success *prometheus.Desc
	// The held keys of strict ordered routes, read in the same pass for
	// the namespaces in held.
	heldKeys, heldOldest, heldMessages *prometheus.Desc

	mu        sync.Mutex
	consumers map[string]struct{}
	held      map[string]struct{}
	last      []inboxRow
	lastHeld  []heldRow
	lastAt    time.Time
	lastOK    bool
}

func newInboxCollector(ns string, constLabels prometheus.Labels, cfg InboxConfig) *inboxCollector {
	if cfg.Table == "" {
		cfg.Table = "inboxmq_inbox"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.MinInterval == 0 {
		cfg.MinInterval = 10 * time.Second
	}
	table := pgx.Identifier(strings.Split(cfg.Table, ".")).Sanitize()
	return &inboxCollector{
		cfg: cfg,
		// One pass: row counts per (consumer, status), and for claims the
		// oldest claim's age (from updated_at, set when a claim is taken or
		// extended) and how many are past their lease.
		query: `SELECT consumer, status, count(*)::float8,
       COALESCE(EXTRACT(EPOCH FROM now() - min(updated_at) FILTER (WHERE status = 'processing')), 0)::float8,
       (count(*) FILTER (WHERE status = 'processing' AND lease_until < now()))::float8
  FROM ` + table + ` GROUP BY consumer, status`,
		rows: prometheus.NewDesc(ns+"_inbox_rows", "Rows in the inbox table, by consumer and status.",
			[]string{"consumer", "status"}, constLabels),
		oldest: prometheus.NewDesc(ns+"_oldest_processing_claim_age_seconds",
			"Age of the oldest claim in status processing (0 when there is none).",
			[]string{"consumer"}, constLabels),
		expired: prometheus.NewDesc(ns+"_inbox_expired_claims",
			"Claims in status processing whose lease has passed (stale claims awaiting the reconciler or a redelivery).",
			[]string{"consumer"}, constLabels),
		success: prometheus.NewDesc(ns+"_inbox_scrape_success",
			"1 if the last query of the inbox table succeeded, 0 if it failed or timed out.", nil, constLabels),
		heldKeys: prometheus.NewDesc(ns+"_held_keys",
			"Ordering keys of strict ordered routes held after a dead letter, by the head's dead-letter reason.",
			[]string{"consumer", "reason"}, constLabels),
		heldOldest: prometheus.NewDesc(ns+"_held_key_oldest_age_seconds",
			"Age of the oldest held ordering key (0 when there is none).", []string{"consumer"}, constLabels),
		heldMessages: prometheus.NewDesc(ns+"_held_messages",
			"Messages waiting behind held ordering keys, their heads' copies included.", []string{"consumer"}, constLabels),
		consumers: map[string]struct{}{},
		held:      map[string]struct{}{},
	}
}

type heldRow struct {
	consumer, reason       string
	keys, oldest, messages float64
}

const heldQuery = `SELECT k.consumer, k.reason, count(*)::float8, EXTRACT(EPOCH FROM now() - min(k.held_at))::float8,
       coalesce(sum((SELECT count(*) FROM inboxmq_held_messages m
                     WHERE m.consumer = k.consumer AND m.ordering_key = k.ordering_key)), 0)::float8
  FROM inboxmq_held_keys k GROUP BY k.consumer, k.reason`

func (c *inboxCollector) addHeld(name string) {
	c.mu.Lock()
	c.held[name] = struct{}{}
	c.mu.Unlock()
}

func (c *inboxCollector) addConsumer(name string) {
	c.mu.Lock()
	c.consumers[name] = struct{}{}
	c.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (c *inboxCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.rows
	ch <- c.oldest
	ch <- c.expired
	ch <- c.success
	ch <- c.heldKeys
	ch <- c.heldOldest
	ch <- c.heldMessages
}

// Collect implements prometheus.Collector: it queries the table (at most
// once per MinInterval, bounded by Timeout) and emits a zero for every known
// status of every known consumer that has no rows.
func (c *inboxCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cfg.MinInterval < 0 || c.lastAt.IsZero() || time.Since(c.lastAt) >= c.cfg.MinInterval {
		rows, held, err := c.fetch()
		c.lastAt = time.Now()
		c.lastOK = err == nil
		if err == nil {
			c.last, c.lastHeld = rows, held
		}
	}
	c.collectHeld(ch)
	ok := 0.0
	if c.lastOK {
		ok = 1
	}
	ch <- prometheus.MustNewConstMetric(c.success, prometheus.GaugeValue, ok)

	type perConsumer struct{ oldest, expired float64 }
	byConsumer := map[string]*perConsumer{}
	seen := map[[2]string]bool{}
	for name := range c.consumers {
		byConsumer[name] = &perConsumer{}
	}
	for _, r := range c.last {
		pc := byConsumer[r.consumer]
		if pc == nil {
			pc = &perConsumer{}
			byConsumer[r.consumer] = pc
		}
		pc.oldest = max(pc.oldest, r.oldestAge)
		pc.expired += r.expired
		seen[[2]string{r.consumer, r.status}] = true
		ch <- prometheus.MustNewConstMetric(c.rows, prometheus.GaugeValue, r.rows, r.consumer, r.status)
	}
	for name, pc := range byConsumer {
		for _, s := range inboxStatuses {
			if !seen[[2]string{name, s}] {
				ch <- prometheus.MustNewConstMetric(c.rows, prometheus.GaugeValue, 0, name, s)
			}
		}
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, pc.oldest, name)
		ch <- prometheus.MustNewConstMetric(c.expired, prometheus.GaugeValue, pc.expired, name)
	}
}

func (c *inboxCollector) fetch() ([]inboxRow, []heldRow, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
	defer cancel()
	rows, err := c.cfg.DB.Query(ctx, c.query)
	if err != nil {
		return nil, nil, err
	}
	inbox, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (inboxRow, error) {
		var r inboxRow
		err := row.Scan(&r.consumer, &r.status, &r.rows, &r.oldestAge, &r.expired)
		return r, err
	})
	if err != nil || len(c.held) == 0 {
		return inbox, nil, err
	}
	if rows, err = c.cfg.DB.Query(ctx, heldQuery); err != nil {
		return nil, nil, err
	}
	held, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (heldRow, error) {
		var r heldRow
		err := row.Scan(&r.consumer, &r.reason, &r.keys, &r.oldest, &r.messages)
		return r, err
	})
	return inbox, held, err
}

// collectHeld emits the held-key gauges: a series per (consumer, reason)
// with held keys, and for every strict namespace the oldest age and the
// waiting messages (zeros when nothing is held).
func (c *inboxCollector) collectHeld(ch chan<- prometheus.Metric) {
	oldest, messages := map[string]float64{}, map[string]float64{}
	for name := range c.held {
		oldest[name], messages[name] = 0, 0
	}
	for _, r := range c.lastHeld {
		ch <- prometheus.MustNewConstMetric(c.heldKeys, prometheus.GaugeValue, r.keys, r.consumer, r.reason)
		oldest[r.consumer] = max(oldest[r.consumer], r.oldest)
		messages[r.consumer] += r.messages
	}
	for name, v := range oldest {
		ch <- prometheus.MustNewConstMetric(c.heldOldest, prometheus.GaugeValue, v, name)
		ch <- prometheus.MustNewConstMetric(c.heldMessages, prometheus.GaugeValue, messages[name], name)
	}
}
