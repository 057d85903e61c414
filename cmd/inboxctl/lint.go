package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/inboxmq/inboxmq/internal/amqpdial"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/topolint"
)

func (c *cli) lintCmd() *cobra.Command {
	var (
		mgmtURL, queueType, dlq string
		attempts                int
		deliveryLimit           int
		handlerTimeout          time.Duration
		tiers                   []time.Duration
	)
	cmd := &cobra.Command{
		Use:   "lint QUEUE...",
		Short: "Check the broker's queues and policies of routes for what loses or loops messages",
		Long: `lint reads each route's queues (the work queue, its dead queue, its delay
tiers and its DLQ, named as a worker names them), their arguments and the
policies and operator policies on them from RabbitMQ's management API, and
flags what silently loses or loops messages:

  error   no-dead-letter-target  a queue whose expired, over-limit or rejected messages go nowhere
  error   delivery-limit         a quorum delivery limit at or below the route's attempts
  error   ttl-without-dead-letter, expires, length-limit
                                 messages dropped by a TTL, a queue that expires, a length limit
  error   at-most-once, overflow quorum dead-lettering that may lose a dead letter
  error   consumer-timeout       a consumer timeout shorter than the handler timeout
  warning policy-override        a policy or an argument that differs from what the worker declares
  warning missing                a queue not declared yet

The route's settings are flags, as the worker's defaults: quorum queues, a
delivery limit of 20, 8 attempts (retry.DefaultPolicy), a 1m handler timeout.
The management API defaults to the broker URL's first host on port 15672
(15671 for amqps), with its credentials. Exit 1 when an error is found, so
that a team can run it in CI; warnings alone exit 0. A worker runs the same
checks at start-up and logs what it finds.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, queues []string) error {
			ctx, cancel := c.ctx(cmd)
			defer cancel()
			broker, err := c.brokerURL()
			if err != nil {
				return err
			}
			// The node list is split as the worker splits it: a comma
			// may sit in a password.
			nodes, err := amqpdial.Parse(broker)
			if err != nil {
				return usageError{err}
			}
			derived, vhost, err := topolint.ManagementURL(nodes[0].URL)
			if err != nil {
				return usageError{err}
			}
			if mgmtURL == "" {
				mgmtURL = derived
			}
			api, err := topolint.NewAPI(mgmtURL, "", "")
			if err != nil {
				return usageError{err}
			}
			typ := consumer.QueueType(queueType)
			if typ != consumer.Quorum && typ != consumer.Classic {
				return usagef("--type must be quorum or classic, not %q", queueType)
			}
			routes := make([]topolint.Route, 0, len(queues))
			for _, q := range queues {
				if !consumer.ValidName(q) {
					return usagef("invalid queue name %q", q)
				}
				opts := &consumer.HandlerOpts{Queue: consumer.QueueOpts{
					Type: typ, DeliveryLimit: deliveryLimit, RetryTiers: tiers, DeadLetterQueue: dlq,
				}}
				rt := topolint.Route{Attempts: attempts, LongestRun: max(handlerTimeout, 0)}
				for _, s := range consumer.Topology(q, opts) {
					rt.Queues = append(rt.Queues, topolint.Queue{Name: s.Name, Role: s.Role, Args: s.Args, Consumed: s.Consumed})
				}
				routes = append(routes, rt)
			}
			found, err := topolint.Lint(ctx, api, vhost, routes)
			if err != nil {
				return err
			}
			if found == nil {
				found = []topolint.Finding{}
			}
			if err := c.emit(found, func(w io.Writer) {
				if len(found) == 0 {
					fmt.Fprintf(w, "no findings: %d route(s) lose and loop nothing\n", len(routes))
					return
				}
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "SEVERITY\tQUEUE\tRULE\tFINDING")
				for _, f := range found {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Severity, f.Queue, f.Rule, f.Message)
				}
				_ = tw.Flush()
			}); err != nil {
				return err
			}
			n := 0
			for _, f := range found {
				if f.Severity == topolint.Error {
					n++
				}
			}
			if n > 0 {
				return fmt.Errorf("lint: %d error(s): these settings lose or loop messages", n)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&mgmtURL, "management-url", "", "RabbitMQ management API URL (default: the broker URL's host, port 15672, its credentials)")
	f.StringVar(&queueType, "type", "quorum", "the routes' queue type: quorum or classic")
	f.IntVar(&attempts, "attempts", 8, "the routes' retry budget (0: not checked)")
	f.IntVar(&deliveryLimit, "delivery-limit", 20, "the delivery limit the worker declares on quorum queues")
	f.DurationVar(&handlerTimeout, "handler-timeout", time.Minute, "the longest a delivery may run (the worker's HandlerTimeout; 0: no bound)")
	f.DurationSliceVar(&tiers, "retry-tiers", nil, "the routes' delay tiers (default: the worker's, 1s,5s,30s,2m,10m)")
	f.StringVar(&dlq, "dlq", "", "the dead-letter queue (default: QUEUE.dlq); with several queues, leave it unset")
	return cmd
}
