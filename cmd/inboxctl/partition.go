package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/inboxmq/inboxmq/migrations"
)

func (c *cli) partitionCmd() *cobra.Command {
	var (
		width   time.Duration
		ahead   int
		dropOld bool
	)
	cmd := &cobra.Command{
		Use:   "partition",
		Short: "Make the inbox table partitioned by time (opt-in), or create partitions ahead",
		Long: `partition turns the inbox table (inboxmq_inbox) into a table partitioned
by time buckets of --width, so that retention drops whole partitions
instead of deleting rows (docs/scaling.md, "The inbox table"). It copies
the rows into the new table in one transaction that holds the old table
locked: stop the workers first, or expect them to wait while it runs. The
old table is renamed inboxmq_inbox_unpartitioned (--drop-old drops it).

On a table that is already partitioned it only creates the partitions
ahead that are missing; the workers' retention job does the same on each
run. Workers detect a partitioned table when they start: restart them
after the conversion.`,
		Example: `  inboxctl partition --width 24h --ahead 3`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if width < time.Second || width%time.Second != 0 {
				return usagef("--width %s: want a whole number of seconds, such as 24h", width)
			}
			if err := intFlagAtLeast("ahead", ahead, 0, "want 0 or more partitions"); err != nil {
				return err
			}
			ctx, pool, done, err := c.dbFor(cmd)
			if err != nil {
				return err
			}
			defer done()
			p, err := migrations.PartitionInbox(ctx, pool, &migrations.PartitionConfig{Width: width, Ahead: max(ahead, 0), DropOld: dropOld})
			if err != nil {
				return err
			}
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass($1)`, p.Table).Scan(&n); err != nil {
				return fmt.Errorf("count partitions: %w", err)
			}
			return c.emit(map[string]any{"table": p.Table, "width_seconds": p.Width.Seconds(), "ahead": p.Ahead, "partitions": n},
				func(w io.Writer) {
					fmt.Fprintf(w, "%s: partitioned by %s, %d partitions (%d ahead)\n", p.Table, p.Width, n, p.Ahead)
				})
		},
	}
	cmd.Flags().DurationVar(&width, "width", 24*time.Hour, "time span of one partition (fixed at the conversion)")
	cmd.Flags().IntVar(&ahead, "ahead", 3, "partitions kept ready past the current one")
	cmd.Flags().BoolVar(&dropOld, "drop-old", false, "drop the unpartitioned table after the copy")
	return cmd
}
