package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/internal/ops"
)

func (c *cli) workersCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "workers",
		Short: "List the worker processes, their namespaces and whether they obey the controls",
		Long: `workers lists the worker processes as each announced itself: its id (the
worker's Config.Name), host, pid, the namespaces of its routes, its inboxmq
version, whether its runtime controls are on, when it was last seen, and its
state: live (seen within 15 seconds), stale (its heartbeats stopped without
a graceful stop: crashed, frozen or cut off from PostgreSQL) or stopped.
Rows not seen for 7 days are deleted.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, pool, done, err := c.dbFor(cmd)
			if err != nil {
				return err
			}
			defer done()
			workers, err := control.NewStore(pool).Workers(ctx)
			if err != nil {
				return err
			}
			return c.emit(workers, func(w io.Writer) {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tHOST\tPID\tNAMESPACES\tVERSION\tCONTROLS\tLAST SEEN\tSTATE")
				for _, p := range workers {
					fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", p.ID, p.Host, p.PID, strings.Join(p.Namespaces, ","),
						p.Version, onOff(p.Controls), p.LastSeen.UTC().Format(time.RFC3339), p.State)
				}
				_ = tw.Flush()
				fmt.Fprintln(w, ops.WorkersSummary(workers))
			})
		},
	}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
