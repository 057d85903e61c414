package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/ops"
)

func (c *cli) controlChange(use, short, long string, apply func(cmd *cobra.Command, s *control.Store, name string, opts *control.ChangeOpts) (string, error), args cobra.PositionalArgs) *cobra.Command {
	var reason string
	var force bool
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long + reachHelp,
		Args:  args,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, pool, done, err := c.dbFor(cmd)
			if err != nil {
				return err
			}
			defer done()
			cmd.SetContext(ctx)
			store := control.NewStore(pool)
			reach, err := c.reach(ctx, store, args[0], force)
			if err != nil {
				return err
			}
			msg, err := apply(cmd, store, args[0], &control.ChangeOpts{By: c.actor(), Reason: reason})
			if err != nil {
				return err
			}
			snap, err := store.List(ctx)
			if err != nil {
				return err
			}
			for _, ctl := range snap.Controls {
				if ctl.Namespace == args[0] {
					return c.emitChange(struct {
						control.Control
						*ops.Reach
					}{ctl, reach}, msg, reach)
				}
			}
			return fmt.Errorf("control row of %q missing after the change", args[0])
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "note stored with the change")
	cmd.Flags().BoolVar(&force, "force", false, "change a namespace that no worker announced and no control names")
	return cmd
}

// reachHelp ends the help of every command that changes a namespace's
// controls.
const reachHelp = `

The command says how many live workers obey the change (their ids with
--output json), and warns on stderr when none does: no live worker serves
NAMESPACE, or those that do run with their controls off. It refuses a
NAMESPACE that no worker (live, stale or stopped) announced and no control
or block names (a typo), listing the known ones, unless --force.`

// reach reads who a change of name reaches, before the change: it
// refuses an invalid name (exit 2) and, unless force, an unknown one
// (exit 3). When the presence rows cannot be read it warns and returns
// nil: the change goes ahead without a count.
func (c *cli) reach(ctx context.Context, s *control.Store, name string, force bool) (*ops.Reach, error) {
	if !consumer.ValidName(name) {
		return nil, fmt.Errorf("%w: namespace %q", control.ErrInvalid, name)
	}
	r, err := ops.ReachOf(ctx, s, name)
	if err != nil {
		c.warn("cannot tell which workers obey (is migration 00006_workers applied? inboxctl migrate): %v", err)
		return nil, nil //nolint:nilnil // no count: the change goes ahead without one
	}
	if uerr := r.Unknown(); uerr != nil && !force {
		return nil, notFoundError{fmt.Errorf("%w; --force changes it anyway", uerr)}
	}
	return &r, nil
}

// emitChange writes v (JSON) or msg with the reach's count (text), and
// the reach's warning on stderr either way.
func (c *cli) emitChange(v any, msg string, reach *ops.Reach) error {
	if reach != nil {
		if w := reach.Warning(); w != "" {
			c.warn("%s", w)
		}
		msg += ": " + reach.Summary()
	}
	return c.emit(v, func(w io.Writer) { fmt.Fprintln(w, msg) })
}

// warn writes a warning line on stderr; the command still succeeds.
func (c *cli) warn(format string, args ...any) {
	fmt.Fprintln(c.errOut, "inboxctl: warning: "+c.redact(fmt.Sprintf(format, args...)))
}

func (c *cli) pauseCmd() *cobra.Command {
	return c.controlChange("pause NAMESPACE", "Pause a namespace on every worker",
		`pause stops namespace NAMESPACE on every running worker whose controls are on,
within 2 seconds: workers cancel their broker consumer, finish in-flight
deliveries and leave the rest in the queue. The pause survives restarts
until resume.`,
		func(cmd *cobra.Command, s *control.Store, name string, o *control.ChangeOpts) (string, error) {
			return "paused " + name, s.Pause(cmd.Context(), name, o)
		}, cobra.ExactArgs(1))
}

func (c *cli) resumeCmd() *cobra.Command {
	return c.controlChange("resume NAMESPACE", "Resume a paused namespace",
		`resume lets namespace NAMESPACE take deliveries again on every worker within
2 seconds.`,
		func(cmd *cobra.Command, s *control.Store, name string, o *control.ChangeOpts) (string, error) {
			return "resumed " + name, s.Resume(cmd.Context(), name, o)
		}, cobra.ExactArgs(1))
}

func (c *cli) concurrencyCmd() *cobra.Command {
	return c.controlChange("concurrency NAMESPACE N", "Limit a namespace's concurrency (0 restores it)",
		`concurrency limits namespace NAMESPACE to N concurrent deliveries per worker
process, from 1 up to its configured concurrency; 0 restores the configured
value. Workers apply it within 2 seconds; running handlers finish.`,
		func(cmd *cobra.Command, s *control.Store, name string, o *control.ChangeOpts) (string, error) {
			n, _ := strconv.Atoi(cmd.Flags().Arg(1)) // checked by concurrencyArgs
			if n == 0 {
				return "restored the configured concurrency of " + name, s.SetConcurrency(cmd.Context(), name, 0, o)
			}
			return fmt.Sprintf("limited %s to %d concurrent deliveries per worker", name, n), s.SetConcurrency(cmd.Context(), name, n, o)
		}, concurrencyArgs)
}

// concurrencyArgs checks NAMESPACE N before anything is read or changed.
func concurrencyArgs(cmd *cobra.Command, args []string) error {
	if err := cobra.ExactArgs(2)(cmd, args); err != nil {
		return err
	}
	if n, err := strconv.Atoi(args[1]); err != nil || n < 0 {
		return usagef("N must be a non-negative integer, not %q", args[1])
	}
	return nil
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
	var namespace, prefix, reason string
	var force bool
	cmd := &cobra.Command{
		Use:   "block KEY|--prefix P --namespace NS",
		Short: "Park deliveries of a key (or key prefix) instead of processing them",
		Long: `block makes workers of namespace NS park every delivery whose idempotency key
is KEY (or starts with P): the message is moved to "<queue>.parked"
unprocessed. Workers pick the block up within 2 seconds. unblock releases
the parked messages.` + strings.ReplaceAll(reachHelp, "NAMESPACE", "NS"),
		Example: `  inboxctl block payment:42 --namespace payments --reason "chargeback dispute"
  inboxctl block --prefix tenant:9: --namespace payments`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pattern, isPrefix, err := blockPattern(args, prefix)
			if err != nil {
				return err
			}
			ctx, pool, done, err := c.dbFor(cmd)
			if err != nil {
				return err
			}
			defer done()
			store := control.NewStore(pool)
			reach, err := c.reach(ctx, store, namespace, force)
			if err != nil {
				return err
			}
			b := control.Block{Namespace: namespace, Pattern: pattern, Prefix: isPrefix, Reason: reason, CreatedBy: c.actor()}
			if err := store.Block(ctx, b); err != nil {
				return err
			}
			kind := "key"
			if isPrefix {
				kind = "prefix"
			}
			return c.emitChange(struct {
				control.Block
				*ops.Reach
			}{b, reach}, fmt.Sprintf("blocked %s %q for %s", kind, pattern, namespace), reach)
		},
	}
	cmd.Flags().StringVar(&namespace, "namespace", "", "inbox namespace (required)")
	cmd.Flags().StringVar(&prefix, "prefix", "", "block every key starting with this prefix")
	cmd.Flags().StringVar(&reason, "reason", "", "note stored with the block")
	cmd.Flags().BoolVar(&force, "force", false, "block for a namespace that no worker announced and no control names")
	_ = cmd.MarkFlagRequired("namespace")
	return cmd
}

func (c *cli) unblockCmd() *cobra.Command {
	var namespace, prefix, queue string
	var noRelease bool
	cmd := &cobra.Command{
		Use:   "unblock KEY|--prefix P --namespace NS",
		Short: "Remove a block and release its parked messages to the work queue",
		Long: `unblock removes the block of KEY (or --prefix P) for namespace NS, then moves
the matching messages from "<queue>.parked" back to the work queue (each
one republished with confirm before it leaves the parked queue), where they
are processed once: the inbox absorbs any duplicate. --queue defaults to
the namespace; --no-release keeps the parked messages (no broker
needed).`,
		Example: `  inboxctl unblock payment:42 --namespace payments
  inboxctl unblock --prefix tenant:9: --namespace payments --queue payments.v2`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pattern, isPrefix, err := blockPattern(args, prefix)
			if err != nil {
				return err
			}
			ctx, pool, done, err := c.dbFor(cmd)
			if err != nil {
				return err
			}
			defer done()
			var conn *amqp.Connection
			if !noRelease {
				if conn, err = c.dialBroker(); err != nil {
					return err
				}
				defer conn.Close()
				if queue == "" {
					queue = namespace
				}
			}
			ur, err := ops.Unblock(ctx, control.NewStore(pool), conn, namespace, pattern, isPrefix, queue)
			if err != nil {
				return err
			}
			removed, released := ur.Removed, ur.Released
			res := map[string]any{"namespace": namespace, "pattern": pattern, "prefix": isPrefix, "removed": removed, "released": released}
			return c.emit(res, func(w io.Writer) {
				if !removed {
					fmt.Fprintf(w, "%q was not blocked for %s\n", pattern, namespace)
				} else {
					fmt.Fprintf(w, "unblocked %q for %s\n", pattern, namespace)
				}
				if !noRelease {
					fmt.Fprintf(w, "released %d parked messages to %s\n", released, queue)
				}
			})
		},
	}
	cmd.Flags().StringVar(&namespace, "namespace", "", "inbox namespace (required)")
	cmd.Flags().StringVar(&prefix, "prefix", "", "remove the block of this key prefix")
	cmd.Flags().StringVar(&queue, "queue", "", "work queue of the namespace (default: the namespace)")
	cmd.Flags().BoolVar(&noRelease, "no-release", false, "leave parked messages parked")
	_ = cmd.MarkFlagRequired("namespace")
	return cmd
}

func (c *cli) controlsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "controls",
		Short: "List paused namespaces, concurrency limits, blocked keys and circuit breakers",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, pool, done, err := c.dbFor(cmd)
			if err != nil {
				return err
			}
			defer done()
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
				fmt.Fprintln(tw, "NAMESPACE\tPAUSED\tCONCURRENCY\tBY\tREASON")
				for _, ctl := range snap.Controls {
					conc := "configured"
					if ctl.Concurrency > 0 {
						conc = strconv.Itoa(ctl.Concurrency)
					}
					fmt.Fprintf(tw, "%s\t%v\t%s\t%s\t%s\n", ctl.Namespace, ctl.Paused, conc, ctl.UpdatedBy, ctl.Reason)
				}
				_ = tw.Flush()
				fmt.Fprintln(w)
				tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAMESPACE\tBLOCKED\tPREFIX\tBY\tREASON")
				for _, b := range snap.Blocks {
					fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%s\n", b.Namespace, b.Pattern, b.Prefix, b.CreatedBy, b.Reason)
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
	fmt.Fprintln(tw, "NAMESPACE\tDOWNSTREAM\tWORKER\tBREAKER\tSINCE")
	for _, b := range breakers {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", b.Namespace, b.Downstream, b.Worker, b.State, b.ChangedAt.UTC().Format(time.RFC3339))
	}
	_ = tw.Flush()
}
