package main

import (
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/internal/ops"
)

func (c *cli) controlChange(use, short, long string, apply func(cmd *cobra.Command, s *control.Store, name string, opts *control.ChangeOpts) (string, error), nargs int) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long,
		Args:  cobra.ExactArgs(nargs),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := c.ctx(cmd)
			defer cancel()
			pool, err := c.openDB(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			cmd.SetContext(ctx)
			msg, err := apply(cmd, control.NewStore(pool), args[0], &control.ChangeOpts{By: c.actor(), Reason: reason})
			if err != nil {
				return err
			}
			snap, err := control.NewStore(pool).List(ctx)
			if err != nil {
				return err
			}
			for _, ctl := range snap.Controls {
				if ctl.Consumer == args[0] {
					return c.emit(ctl, func(w io.Writer) { fmt.Fprintln(w, msg) })
				}
			}
			return fmt.Errorf("control row of %q missing after the change", args[0])
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "note stored with the change")
	return cmd
}

func (c *cli) pauseCmd() *cobra.Command {
	return c.controlChange("pause CONSUMER", "Pause a consumer on every worker",
		`pause stops consumer CONSUMER on every running worker within 2 seconds:
workers cancel their broker consumer, finish in-flight deliveries and leave
the rest in the queue. The pause survives restarts until resume.`,
		func(cmd *cobra.Command, s *control.Store, name string, o *control.ChangeOpts) (string, error) {
			return "paused " + name, s.Pause(cmd.Context(), name, o)
		}, 1)
}

func (c *cli) resumeCmd() *cobra.Command {
	return c.controlChange("resume CONSUMER", "Resume a paused consumer",
		`resume lets consumer CONSUMER take deliveries again on every worker within
2 seconds.`,
		func(cmd *cobra.Command, s *control.Store, name string, o *control.ChangeOpts) (string, error) {
			return "resumed " + name, s.Resume(cmd.Context(), name, o)
		}, 1)
}

func (c *cli) concurrencyCmd() *cobra.Command {
	cmd := c.controlChange("concurrency CONSUMER N", "Limit a consumer's concurrency (0 restores it)",
		`concurrency limits consumer CONSUMER to N concurrent deliveries per worker
process, from 1 up to its configured concurrency; 0 restores the configured
value. Workers apply it within 2 seconds; running handlers finish.`,
		func(cmd *cobra.Command, s *control.Store, name string, o *control.ChangeOpts) (string, error) {
			n, err := strconv.Atoi(cmd.Flags().Arg(1))
			if err != nil || n < 0 {
				return "", usagef("N must be a non-negative integer, not %q", cmd.Flags().Arg(1))
			}
			if n == 0 {
				return "restored the configured concurrency of " + name, s.SetConcurrency(cmd.Context(), name, 0, o)
			}
			return fmt.Sprintf("limited %s to %d concurrent deliveries per worker", name, n), s.SetConcurrency(cmd.Context(), name, n, o)
		}, 2)
	return cmd
}

// blockArgs reads KEY or --prefix P.
func blockPattern(args []string, prefix string) (string, bool, error) {
	switch {
	case prefix != "" && len(args) > 0:
		return "", false, usagef("give either KEY or --prefix, not both")
	case prefix != "":
		return prefix, true, nil
	case len(args) == 1:
		return args[0], false, nil
	default:
		return "", false, usagef("give KEY or --prefix P")
	}
}

func (c *cli) blockCmd() *cobra.Command {
	var consumerName, prefix, reason string
	cmd := &cobra.Command{
		Use:   "block KEY|--prefix P --consumer C",
		Short: "Park deliveries of a key (or key prefix) instead of processing them",
		Long: `block makes workers of consumer C park every delivery whose idempotency key
is KEY (or starts with P): the message is moved to "<queue>.parked"
unprocessed. Workers pick the block up within 2 seconds (the Block
middleware must be installed). unblock releases the parked messages.`,
		Example: `  inboxctl block payment:42 --consumer payments --reason "chargeback dispute"
  inboxctl block --prefix tenant:9: --consumer payments`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pattern, isPrefix, err := blockPattern(args, prefix)
			if err != nil {
				return err
			}
			ctx, cancel := c.ctx(cmd)
			defer cancel()
			pool, err := c.openDB(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			b := control.Block{Consumer: consumerName, Pattern: pattern, Prefix: isPrefix, Reason: reason, CreatedBy: c.actor()}
			if err := control.NewStore(pool).Block(ctx, b); err != nil {
				return err
			}
			return c.emit(b, func(w io.Writer) {
				kind := "key"
				if isPrefix {
					kind = "prefix"
				}
				fmt.Fprintf(w, "blocked %s %q for %s\n", kind, pattern, consumerName)
			})
		},
	}
	cmd.Flags().StringVar(&consumerName, "consumer", "", "consumer (inbox namespace) (required)")
	cmd.Flags().StringVar(&prefix, "prefix", "", "block every key starting with this prefix")
	cmd.Flags().StringVar(&reason, "reason", "", "note stored with the block")
	_ = cmd.MarkFlagRequired("consumer")
	return cmd
}

func (c *cli) unblockCmd() *cobra.Command {
	var consumerName, prefix, queue string
	var noRelease bool
	cmd := &cobra.Command{
		Use:   "unblock KEY|--prefix P --consumer C",
		Short: "Remove a block and release its parked messages to the work queue",
		Long: `unblock removes the block of KEY (or --prefix P) for consumer C, then moves
the matching messages from "<queue>.parked" back to the work queue (each
one republished with confirm before it leaves the parked queue), where they
are processed once: the inbox absorbs any duplicate. --queue defaults to
the consumer's name; --no-release keeps the parked messages (no broker
needed).`,
		Example: `  inboxctl unblock payment:42 --consumer payments
  inboxctl unblock --prefix tenant:9: --consumer payments --queue payments.v2`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pattern, isPrefix, err := blockPattern(args, prefix)
			if err != nil {
				return err
			}
			ctx, cancel := c.ctx(cmd)
			defer cancel()
			pool, err := c.openDB(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			var conn *amqp.Connection
			if !noRelease {
				if conn, err = c.dialBroker(); err != nil {
					return err
				}
				defer conn.Close()
				if queue == "" {
					queue = consumerName
				}
			}
			ur, err := ops.Unblock(ctx, control.NewStore(pool), conn, consumerName, pattern, isPrefix, queue)
			if err != nil {
				return err
			}
			removed, released := ur.Removed, ur.Released
			res := map[string]any{"consumer": consumerName, "pattern": pattern, "prefix": isPrefix, "removed": removed, "released": released}
			return c.emit(res, func(w io.Writer) {
				if !removed {
					fmt.Fprintf(w, "%q was not blocked for %s\n", pattern, consumerName)
				} else {
					fmt.Fprintf(w, "unblocked %q for %s\n", pattern, consumerName)
				}
				if !noRelease {
					fmt.Fprintf(w, "released %d parked messages to %s\n", released, queue)
				}
			})
		},
	}
	cmd.Flags().StringVar(&consumerName, "consumer", "", "consumer (inbox namespace) (required)")
	cmd.Flags().StringVar(&prefix, "prefix", "", "remove the block of this key prefix")
	cmd.Flags().StringVar(&queue, "queue", "", "work queue of the consumer (default: the consumer's name)")
	cmd.Flags().BoolVar(&noRelease, "no-release", false, "leave parked messages parked")
	_ = cmd.MarkFlagRequired("consumer")
	return cmd
}

func (c *cli) controlsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "controls",
		Short: "List paused consumers, concurrency limits, blocked keys and circuit breakers",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := c.ctx(cmd)
			defer cancel()
			pool, err := c.openDB(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			store := control.NewStore(pool)
			snap, err := store.List(ctx)
			if err != nil {
				return err
			}
			breakers, err := store.Breakers(ctx, "")
			if err != nil {
				return err
			}
			out := struct {
				*control.Snapshot
				Breakers []control.BreakerState `json:"breakers"`
			}{snap, breakers}
			return c.emit(out, func(w io.Writer) {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "CONSUMER\tPAUSED\tCONCURRENCY\tBY\tREASON")
				for _, ctl := range snap.Controls {
					conc := "configured"
					if ctl.Concurrency > 0 {
						conc = strconv.Itoa(ctl.Concurrency)
					}
					fmt.Fprintf(tw, "%s\t%v\t%s\t%s\t%s\n", ctl.Consumer, ctl.Paused, conc, ctl.UpdatedBy, ctl.Reason)
				}
				_ = tw.Flush()
				fmt.Fprintln(w)
				tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "CONSUMER\tBLOCKED\tPREFIX\tBY\tREASON")
				for _, b := range snap.Blocks {
					fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%s\n", b.Consumer, b.Pattern, b.Prefix, b.CreatedBy, b.Reason)
				}
				_ = tw.Flush()
				printBreakers(w, breakers)
			})
		},
	}
}

// printBreakers prints the circuit breakers' states that the workers
// published (nothing when there are none).
func printBreakers(w io.Writer, breakers []control.BreakerState) {
	if len(breakers) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONSUMER\tDOWNSTREAM\tWORKER\tBREAKER\tSINCE")
	for _, b := range breakers {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", b.Consumer, b.Downstream, b.Worker, b.State, b.ChangedAt.UTC().Format(time.RFC3339))
	}
	_ = tw.Flush()
}
