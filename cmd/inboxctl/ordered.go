package main

import (
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/inboxmq/inboxmq/internal/held"
)

func (c *cli) orderedCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ordered",
		Short: "List, release or skip the held keys of strict ordered routes",
		Long: `On an ordered route with OrderedOpts.Strict, a message that is dead-lettered
holds its ordering key: the key's later messages wait in PostgreSQL, in
order, and nothing of the key runs until an operator acts. Other keys flow.

  list     the held keys: age, state, the head's message id, reason and error,
           and how many messages wait (the head's copy included)
  release  run the head's copy again, then the waiting messages one at a time,
           in order; if the head fails again the key is held again
  skip     drop the head (its dead letter stays in the DLQ) and release the rest

Replaying the head's dead letter (inboxctl dlq replay) also releases the key
once it has committed. Only PostgreSQL is needed: released messages go out
through the outbox relay of the running workers. See docs/ordering.md.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(c.orderedListCmd(), c.orderedActCmd("release"), c.orderedActCmd("skip"))
	return cmd
}

func (c *cli) orderedListCmd() *cobra.Command {
	var namespace string
	cmd := &cobra.Command{
		Use:   "list [--namespace NS]",
		Short: "List the held keys, oldest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, pool, done, err := c.dbFor(cmd)
			if err != nil {
				return err
			}
			defer done()
			keys, err := held.NewStore(pool).List(ctx, namespace)
			if err != nil {
				return err
			}
			if keys == nil {
				keys = []held.Key{}
			}
			now := time.Now()
			return c.emit(keys, func(w io.Writer) {
				if len(keys) == 0 {
					fmt.Fprintln(w, "no held keys")
					return
				}
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAMESPACE\tKEY\tSTATE\tAGE\tWAITING\tHEAD\tREASON\tERROR")
				for _, k := range keys {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", k.Namespace, k.Key, k.State,
						k.Age(now).Round(time.Second), k.Parked, k.HeadMessageID, k.Reason, k.LastError)
				}
				_ = tw.Flush()
			})
		},
	}
	cmd.Flags().StringVar(&namespace, "namespace", "", "only this inbox namespace (default: all)")
	return cmd
}

func (c *cli) orderedActCmd(action string) *cobra.Command {
	var namespace string
	short := "Run a held key's head again, then its waiting messages in order"
	if action == "skip" {
		short = "Drop a held key's head and release its waiting messages in order"
	}
	cmd := &cobra.Command{
		Use:     action + " KEY --namespace NS",
		Short:   short,
		Example: "  inboxctl ordered " + action + " account-42 --namespace ledger",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, pool, done, err := c.dbFor(cmd)
			if err != nil {
				return err
			}
			defer done()
			s := held.NewStore(pool)
			do := s.Release
			if action == "skip" {
				do = s.Skip
			}
			if err := do(ctx, namespace, args[0]); err != nil {
				if errors.Is(err, held.ErrNotHeld) {
					return notFoundError{err}
				}
				return err
			}
			res := map[string]any{"namespace": namespace, "key": args[0], "action": action}
			return c.emit(res, func(w io.Writer) {
				verb := "released"
				if action == "skip" {
					verb = "skipped the head of"
				}
				fmt.Fprintf(w, "%s %q in %s: its messages go back one at a time (inboxctl ordered list shows the progress)\n",
					verb, args[0], namespace)
			})
		},
	}
	cmd.Flags().StringVar(&namespace, "namespace", "", "inbox namespace of the route (required)")
	_ = cmd.MarkFlagRequired("namespace")
	return cmd
}
