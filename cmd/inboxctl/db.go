package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/internal/ops"
	"github.com/inboxmq/inboxmq/migrations"
)

func (c *cli) migrateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "Apply pending inboxmq migrations to the database",
		Long: `migrate applies every pending inboxmq migration (inbox, outbox, controls)
in the first schema of the connection's search_path. It is safe to run
concurrently and again: applied migrations are skipped.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, pool, done, err := c.dbFor(cmd)
			if err != nil {
				return err
			}
			defer done()
			if err := migrations.Up(ctx, pool); err != nil {
				return err
			}
			var version int64
			if err := pool.QueryRow(ctx, `SELECT coalesce(max(version_id), 0) FROM `+migrations.VersionTable+` WHERE is_applied`).Scan(&version); err != nil {
				return fmt.Errorf("read schema version: %w", err)
			}
			return c.emit(map[string]any{"version": version}, func(w io.Writer) {
				fmt.Fprintf(w, "migrated: schema version %d\n", version)
			})
		},
	}
}

// recordView is an inbox row as inboxctl prints it.
type recordView struct {
	Namespace    string     `json:"namespace"`
	Key          string     `json:"key"`
	Status       string     `json:"status"`
	Fence        int64      `json:"fence"`
	Owner        *string    `json:"owner"`
	LeaseUntil   *time.Time `json:"lease_until"`
	Attempts     int        `json:"attempts"`
	Redeliveries int        `json:"redeliveries"`
	LastError    *string    `json:"last_error"`
	LastFailedAt *time.Time `json:"last_failed_at"`
	MessageID    *string    `json:"message_id"`
	FirstSeenAt  time.Time  `json:"first_seen_at"`
	UpdatedAt    time.Time  `json:"updated_at"`
	CompletedAt  *time.Time `json:"completed_at"`
	// Result is the job's stored result (JSON), replayed to duplicates.
	Result json.RawMessage `json:"result"`
	// Breakers are the namespace's circuit breakers as the workers
	// published them: a key that waits may be held back by one.
	Breakers []control.BreakerState `json:"breakers,omitempty"`
}

func viewOf(r *inbox.Record) recordView {
	return recordView{
		Namespace: r.Namespace, Key: r.Key, Status: r.Status, Fence: r.Fence, Owner: r.Owner, LeaseUntil: r.LeaseUntil,
		Attempts: r.Attempts, Redeliveries: r.Deliveries, LastError: r.LastError, LastFailedAt: r.LastFailedAt,
		MessageID: r.MessageID, FirstSeenAt: r.FirstSeenAt, UpdatedAt: r.UpdatedAt, CompletedAt: r.CompletedAt,
		Result: r.Result,
	}
}

// resultText is a stored result as status prints it: at most 200 bytes.
func resultText(r json.RawMessage) string {
	if r == nil {
		return "-"
	}
	const limit = 200
	if len(r) > limit {
		return string(r[:limit]) + "…"
	}
	return string(r)
}

func str(p *string) string {
	if p == nil {
		return "-"
	}
	return *p
}

func tm(p *time.Time) string {
	if p == nil {
		return "-"
	}
	return p.UTC().Format(time.RFC3339)
}

func (c *cli) statusCmd() *cobra.Command {
	var namespace string
	cmd := &cobra.Command{
		Use:   "status KEY --namespace NS",
		Short: "Show the inbox row of one idempotency key",
		Long: `status prints the inbox row of (NS, KEY): status, fence, owner and
lease, attempts, redeliveries, last error, times and the stored result
(what duplicates of the key get back). It exits with code 3
if the inbox has no such row (the message was never seen, or retention
deleted it).

attempts is the broker attempt (x-attempt) of the last delivery that took
the key up or failed on it: in-process tries do not add to it, and it is
the attempt a dead-letter copy of the key carries. redeliveries is the
crash-loop counter: the broker's redeliveries of the key on classic queues
(a worker died or lost its connection before settling), not every delivery;
it is 0 for a key that only went through retries.`,
		Example: `  inboxctl status payment:42 --namespace payments
  inboxctl status payment:42 --namespace payments -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, s, done, err := c.storeFor(cmd)
			if err != nil {
				return err
			}
			defer done()
			r, err := s.Get(ctx, namespace, args[0])
			if errors.Is(err, inbox.ErrNotFound) {
				return notFoundError{fmt.Errorf("no inbox row for namespace %q, key %q", namespace, args[0])}
			}
			if err != nil {
				return err
			}
			v := viewOf(r)
			// The row is the answer; the breakers are context (absent
			// before the migration that adds their table).
			v.Breakers, _ = control.NewStore(s.Pool()).Breakers(ctx, namespace)
			return c.emit(v, func(w io.Writer) {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				for _, kv := range [][2]string{
					{"namespace", v.Namespace},
					{"key", v.Key},
					{"status", v.Status},
					{"fence", fmt.Sprint(v.Fence)},
					{"owner", str(v.Owner)},
					{"lease_until", tm(v.LeaseUntil)},
					{"attempts (broker attempt)", fmt.Sprint(v.Attempts)},
					{"redeliveries (crash counter)", fmt.Sprint(v.Redeliveries)},
					{"last_error", str(v.LastError)},
					{"last_failed_at", tm(v.LastFailedAt)},
					{"message_id", str(v.MessageID)},
					{"first_seen_at", tm(&v.FirstSeenAt)},
					{"updated_at", tm(&v.UpdatedAt)},
					{"completed_at", tm(v.CompletedAt)},
					{"result", resultText(v.Result)},
				} {
					fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
				}
				_ = tw.Flush()
				printBreakers(w, v.Breakers)
			})
		},
	}
	cmd.Flags().StringVar(&namespace, "namespace", "", "inbox namespace of the key (required)")
	_ = cmd.MarkFlagRequired("namespace")
	return cmd
}

func printRecords(w io.Writer, recs []recordView) {
	if len(recs) == 0 {
		fmt.Fprintln(w, "no stale claims")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tKEY\tOWNER\tFENCE\tLEASE_UNTIL\tATTEMPTS\tLAST_ERROR")
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\t%s\n", r.Namespace, r.Key, str(r.Owner), r.Fence, tm(r.LeaseUntil), r.Attempts, str(r.LastError))
	}
	_ = tw.Flush()
}

func (c *cli) staleCmd() *cobra.Command {
	var olderThan time.Duration
	cmd := &cobra.Command{
		Use:   "stale",
		Short: "List claims whose lease has expired",
		Long: `stale lists claim-mode rows (status processing) whose lease ended more
than --older-than ago, oldest first (at most 1000). Such a claim belongs to
a worker that died or hung; reconcile makes it safe to retry.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if olderThan < 0 {
				return usagef("--older-than %s: want a duration of 0 or more", olderThan)
			}
			ctx, s, done, err := c.storeFor(cmd)
			if err != nil {
				return err
			}
			defer done()
			recs, err := s.Stale(ctx, olderThan)
			if err != nil {
				return err
			}
			views := make([]recordView, 0, len(recs))
			for _, r := range recs {
				views = append(views, viewOf(r))
			}
			return c.emit(views, func(w io.Writer) { printRecords(w, views) })
		},
	}
	cmd.Flags().DurationVar(&olderThan, "older-than", 0, "only claims whose lease ended at least this long ago")
	return cmd
}

func (c *cli) purgeCmd() *cobra.Command {
	var (
		olderThan time.Duration
		batch     int
	)
	cmd := &cobra.Command{
		Use:   "purge --older-than DURATION",
		Short: "Delete completed inbox rows older than DURATION (retention, batched)",
		Long: `purge runs one retention pass: it deletes completed inbox rows whose
completed_at is older than --older-than, in batches of --batch-size rows
(one short transaction each, oldest first, skipping locked rows). Only one
retention pass runs at a time per table; if a worker's retention job is
running, purge reports "skipped".

A copy of a message that arrives after its row was deleted is processed
again: never purge inside the redelivery horizon (retry delays × attempts
plus the DLQ replay window).

On a partitioned inbox (inboxctl partition) purge deletes no row: it drops
the partitions whose whole span is older than --older-than, after moving
the rows it must keep (not completed, or completed since) to the current
partition, --batch-size rows per statement.`,
		Example: `  inboxctl purge --older-than 168h`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if olderThan <= 0 {
				return usagef("--older-than must be a positive duration such as 168h")
			}
			if err := intFlagAtLeast("batch-size", batch, 1, "want a positive number of rows per statement"); err != nil {
				return err
			}
			ctx, s, done, err := c.storeFor(cmd)
			if err != nil {
				return err
			}
			defer done()
			r, err := inbox.NewRetention(s, &inbox.RetentionConfig{Window: olderThan, BatchSize: batch})
			if err != nil {
				return err
			}
			run, err := r.RunOnce(ctx)
			if err != nil {
				return err
			}
			if s.Partitioned() {
				return c.emit(map[string]any{"partitions": run.Partitions, "deleted_estimate": run.Deleted, "moved": run.Moved,
					"kept": run.Kept, "skipped": run.Skipped}, func(w io.Writer) {
					if run.Skipped {
						fmt.Fprintln(w, "skipped: another retention pass holds the lock")
						return
					}
					fmt.Fprintf(w, "dropped %d partitions (about %d rows), moved %d rows to keep, %d partitions left for a later pass\n",
						run.Partitions, run.Deleted, run.Moved, run.Kept)
				})
			}
			return c.emit(map[string]any{"deleted": run.Deleted, "batches": run.Batches, "skipped": run.Skipped}, func(w io.Writer) {
				if run.Skipped {
					fmt.Fprintln(w, "skipped: another retention pass holds the lock")
					return
				}
				fmt.Fprintf(w, "deleted %d completed rows in %d batches\n", run.Deleted, run.Batches)
			})
		},
	}
	cmd.Flags().DurationVar(&olderThan, "older-than", 0, "delete completed rows older than this (required), e.g. 168h")
	cmd.Flags().IntVar(&batch, "batch-size", 1000, "rows per DELETE (on a partitioned inbox: rows moved per statement)")
	_ = cmd.MarkFlagRequired("older-than")
	return cmd
}

func (c *cli) statsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "stats",
		Short: "Inbox rows by namespace and status, oldest claim, table and index sizes",
		Long: `stats counts inbox rows by namespace and status, reports the age of the
oldest live claim and the number of claims past their lease, and the size
of the inbox table and its indexes. Counting is a full scan of the table:
on a very large inbox prefer the estimate (estimated_rows).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, s, done, err := c.storeFor(cmd)
			if err != nil {
				return err
			}
			defer done()
			v, err := ops.InboxStats(ctx, s)
			if err != nil {
				return err
			}
			return c.emit(v, func(w io.Writer) {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAMESPACE\tSTATUS\tROWS")
				for _, r := range v.Rows {
					fmt.Fprintf(tw, "%s\t%s\t%d\n", r.Namespace, r.Status, r.Count)
				}
				_ = tw.Flush()
				age := "-"
				if v.OldestClaimAgeSeconds != nil {
					age = time.Duration(*v.OldestClaimAgeSeconds * float64(time.Second)).Round(time.Second).String()
				}
				fmt.Fprintf(w, "oldest claim: %s\nstale claims: %d\ntable: %s  indexes: %s  total: %s\n",
					age, v.StaleClaims, bytesText(v.TableBytes), bytesText(v.IndexBytes), bytesText(v.TotalBytes))
			})
		},
	}
}

func bytesText(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
