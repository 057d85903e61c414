package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/inboxmq/inboxmq/inbox"
)

// staleClaimView is one reconciled claim as inboxctl prints it.
type staleClaimView struct {
	Namespace  string    `json:"namespace"`
	Key        string    `json:"key"`
	Owner      *string   `json:"owner"`
	Fence      int64     `json:"fence"`
	Attempts   int       `json:"attempts"`
	LastError  *string   `json:"last_error"`
	LeaseUntil time.Time `json:"lease_until"`
	Action     string    `json:"action"`
}

// reconcileView is the output of reconcile.
type reconcileView struct {
	DryRun    bool             `json:"dry_run"`
	Completed int              `json:"completed"`
	Released  int              `json:"released"`
	Dead      int              `json:"dead"`
	Claims    []staleClaimView `json:"claims"`
}

func (c *cli) reconcileCmd() *cobra.Command {
	var (
		dryRun      bool
		grace       time.Duration
		batch       int
		maxAttempts int
	)
	cmd := &cobra.Command{
		Use:   "reconcile [--dry-run]",
		Short: "Run one reconciler pass over stale claims",
		Long: `reconcile runs one pass of the inbox reconciler: it finds claims more than
--grace past their lease (their worker vanished), and makes each safe to
retry: released (status failed, so a redelivery or replay takes it up), or
dead after --max-attempts. Effect checks are application code, so this
pass never completes a claim; run the worker's reconciler for that.

Run it with --dry-run first: it lists what the pass would touch (action
none) and changes nothing.`,
		Example: `  inboxctl reconcile --dry-run
  inboxctl reconcile --grace 1m`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if grace < 0 {
				return usagef("--grace %s: want a duration of 0 or more", grace)
			}
			if err := intFlagAtLeast("batch-size", batch, 1, "want a positive number of claims"); err != nil {
				return err
			}
			if maxAttempts == 0 {
				return usagef("--max-attempts 0: want a positive bound, or -1 never to mark claims dead")
			}
			if err := intFlagAtLeast("max-attempts", maxAttempts, -1, "want a positive bound, or -1 never to mark claims dead"); err != nil {
				return err
			}
			ctx, s, done, err := c.storeFor(cmd)
			if err != nil {
				return err
			}
			defer done()
			r, err := inbox.NewReconciler(s, &inbox.ReconcilerConfig{Grace: grace, BatchSize: batch, MaxAttempts: maxAttempts})
			if err != nil {
				return usageError{err}
			}
			rep, err := r.RunOnce(ctx, dryRun)
			if err != nil {
				return err
			}
			v := reconcileView{DryRun: rep.DryRun, Completed: rep.Completed, Released: rep.Released, Dead: rep.Dead, Claims: []staleClaimView{}}
			for _, cl := range rep.Claims {
				v.Claims = append(v.Claims, staleClaimView(cl))
			}
			return c.emit(v, func(w io.Writer) {
				if dryRun {
					fmt.Fprintf(w, "dry run: %d stale claims found, nothing changed\n", len(v.Claims))
				} else {
					fmt.Fprintf(w, "reconciled %d stale claims: %d released, %d dead, %d completed\n",
						len(v.Claims), v.Released, v.Dead, v.Completed)
				}
				if len(v.Claims) == 0 {
					return
				}
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAMESPACE\tKEY\tOWNER\tFENCE\tATTEMPTS\tLEASE_UNTIL\tACTION\tLAST_ERROR")
				for _, cl := range v.Claims {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", cl.Namespace, cl.Key, str(cl.Owner), cl.Fence,
						cl.Attempts, tm(&cl.LeaseUntil), cl.Action, str(cl.LastError))
				}
				_ = tw.Flush()
			})
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "list what the pass would do, change nothing")
	cmd.Flags().DurationVar(&grace, "grace", 30*time.Second, "how long past its lease a claim must be to count as stale")
	cmd.Flags().IntVar(&batch, "batch-size", 100, "most claims handled in the pass")
	cmd.Flags().IntVar(&maxAttempts, "max-attempts", 10, "mark a claim dead instead of releasing it once its key was claimed this often (its fence; -1: never)")
	return cmd
}
