package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/inboxmq/inboxmq/inbox"
)

func (c *cli) reconcileCmd() *cobra.Command {
	var dryRun bool
	var olderThan time.Duration
	cmd := &cobra.Command{
		Use:   "reconcile [--dry-run]",
		Short: "Run one reconciler pass over stale claims",
		Long: `reconcile runs one pass of the inbox reconciler: it finds claims past
their lease, logs them with their last owner and error, and makes them safe
to retry. Run it with --dry-run first: it lists what a pass would touch and
changes nothing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := c.ctx(cmd)
			defer cancel()
			pool, err := c.openDB(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			s, err := inbox.NewStore(ctx, pool, nil)
			if err != nil {
				return err
			}
			if !dryRun {
				return reconcileOnce(ctx, c, s)
			}
			recs, err := s.Stale(ctx, olderThan)
			if err != nil {
				return err
			}
			views := make([]recordView, 0, len(recs))
			for _, r := range recs {
				views = append(views, viewOf(r))
			}
			return c.emit(map[string]any{"dry_run": true, "stale": views}, func(w io.Writer) {
				fmt.Fprintf(w, "dry run: %d stale claims would be reconciled\n", len(views))
				if len(views) > 0 {
					printRecords(w, views)
				}
			})
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "list what the pass would do, change nothing")
	cmd.Flags().DurationVar(&olderThan, "older-than", 0, "only claims whose lease ended at least this long ago")
	return cmd
}
