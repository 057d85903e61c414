package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
)

// counts are the effects of one run.
type counts struct {
	Payments     int
	Ledger       int
	QueueDepth   int
	DeadLettered int
	Duplicates   float64 // from the metrics endpoint; -1 when unknown
	Elapsed      time.Duration
}

// reportCmd is `inboxload report`: it waits until the burst of --summary is
// processed, prints its effects and returns errFailed unless there is one
// payments row per valid order and one ledger entry per payment.
func reportCmd(ctx context.Context, cfg config, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("inboxload report", flag.ContinueOnError)
	summaryPath := fs.String("summary", "demo-summary.json", "the summary written by publish")
	metricsURL := fs.String("metrics-url", "", "the worker's /metrics URL (for duplicates detected)")
	wait := fs.Duration("wait", 2*time.Minute, "how long to wait for the burst to be processed")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("inboxload: report: %w", err)
	}
	raw, err := os.ReadFile(*summaryPath)
	if err != nil {
		return fmt.Errorf("inboxload: report: %w", err)
	}
	var s summary
	if err := json.Unmarshal(raw, &s); err != nil {
		return fmt.Errorf("inboxload: report: summary %s: %w", *summaryPath, err)
	}
	c, err := waitDrained(ctx, cfg, s, *metricsURL, *wait)
	if err != nil {
		return err
	}
	return printReport(out, s, c)
}

// waitDrained polls until every valid order is paid, every invalid message
// is dead-lettered, the queue is empty and (with a metrics URL) every copy
// is accounted for as a duplicate, or until wait passes. It returns the last
// counts either way; the report judges them.
func waitDrained(ctx context.Context, cfg config, s summary, metricsURL string, wait time.Duration) (counts, error) {
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		// The parse error may echo the URL: never wrap it.
		return counts{}, errors.New("inboxload: report: DATABASE_URL is not a valid PostgreSQL URL")
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return counts{}, fmt.Errorf("inboxload: report: %w", err)
	}
	defer pool.Close()
	conn, _, err := consumer.Dial(ctx, cfg.AMQPURL, &consumer.DialOpts{Name: "inboxload report"})
	if err != nil {
		return counts{}, fmt.Errorf("inboxload: report: %w", err)
	}
	defer conn.Close()

	start := s.StartedAt
	if start.IsZero() {
		start = time.Now()
	}
	deadline := time.Now().Add(wait)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := measure(ctx, pool, conn, s, metricsURL)
		if err != nil {
			return c, err
		}
		c.Elapsed = time.Since(start)
		done := c.Payments >= s.UniqueOrders && c.DeadLettered >= s.Invalid && c.QueueDepth == 0 &&
			(c.Duplicates < 0 || int(c.Duplicates) >= s.ValidCopies-s.UniqueOrders)
		if done || time.Now().After(deadline) {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return c, ctx.Err()
		case <-tick.C:
		}
	}
}

func measure(ctx context.Context, pool *pgxpool.Pool, conn *amqp.Connection, s summary, metricsURL string) (counts, error) {
	c := counts{Duplicates: -1}
	like := s.RunID + "-%"
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payments WHERE order_id LIKE $1`, like).Scan(&c.Payments); err != nil {
		return c, fmt.Errorf("inboxload: report: count payments: %w", err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE order_id LIKE $1`, like).Scan(&c.Ledger); err != nil {
		return c, fmt.Errorf("inboxload: report: count ledger entries: %w", err)
	}
	var err error
	if c.QueueDepth, err = depth(conn, s.Queue); err != nil {
		return c, err
	}
	if c.DeadLettered, err = depth(conn, inboxtype.DeadLetterQueue(s.Queue)); err != nil {
		return c, err
	}
	if metricsURL != "" {
		if d, err := scrapeSum(ctx, metricsURL, "duplicate_detected_total"); err == nil {
			c.Duplicates = d
		}
	}
	return c, nil
}

func depth(conn *amqp.Connection, queue string) (int, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("inboxload: report: channel: %w", err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("inboxload: report: inspect %s: %w", queue, err)
	}
	return q.Messages, nil
}

// scrapeSum sums every sample of the metrics at url whose name ends in
// suffix.
func scrapeSum(ctx context.Context, url, suffix string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, fmt.Errorf("inboxload: scrape: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("inboxload: scrape: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("inboxload: scrape %s: HTTP %d", url, resp.StatusCode)
	}
	return sumMetric(resp.Body, suffix)
}

// sumMetric parses Prometheus text exposition and sums the counter, gauge
// and untyped samples of the families whose name ends in suffix.
func sumMetric(r io.Reader, suffix string) (float64, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return 0, fmt.Errorf("inboxload: parse metrics: %w", err)
	}
	var sum float64
	for name, f := range families {
		if !strings.HasSuffix(name, suffix) {
			continue
		}
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
		}
	}
	return sum, nil
}

// printReport prints the run's table and returns errFailed when the effects
// are not exactly one payment and one ledger entry per valid order.
func printReport(w io.Writer, s summary, c counts) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	dups := "n/a"
	if c.Duplicates >= 0 {
		dups = strconv.FormatFloat(c.Duplicates, 'f', 0, 64)
	}
	fmt.Fprintf(tw, "published\t%d\t(%d copies of valid orders, %d invalid)\n", s.Published, s.ValidCopies, s.Invalid)
	fmt.Fprintf(tw, "unique orders\t%d\t\n", s.UniqueOrders)
	fmt.Fprintf(tw, "payments rows\t%d\t\n", c.Payments)
	fmt.Fprintf(tw, "ledger rows\t%d\t\n", c.Ledger)
	fmt.Fprintf(tw, "duplicates detected\t%s\t(expected %d)\n", dups, s.ValidCopies-s.UniqueOrders)
	fmt.Fprintf(tw, "dead-lettered\t%d\t(expected %d)\n", c.DeadLettered, s.Invalid)
	fmt.Fprintf(tw, "left in queue\t%d\t\n", c.QueueDepth)
	if secs := c.Elapsed.Seconds(); secs > 0 {
		fmt.Fprintf(tw, "drained in\t%.1fs\t(from the first publish: %.0f msg/s)\n", secs, float64(s.Published)/secs)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("inboxload: report: %w", err)
	}
	switch {
	case c.Payments != s.UniqueOrders:
		fmt.Fprintf(w, "FAIL: %d payments rows for %d unique valid orders\n", c.Payments, s.UniqueOrders)
		return errFailed
	case c.Ledger != c.Payments:
		fmt.Fprintf(w, "FAIL: %d ledger rows for %d payments\n", c.Ledger, c.Payments)
		return errFailed
	}
	fmt.Fprintln(w, "OK: exactly one payment and one ledger entry per order")
	return nil
}
