package main

import (
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/ops"
)

func (c *cli) dlqCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "Inspect, replay and purge a queue's dead-letter queue",
		Long: `dlq works on the dead-letter queue of QUEUE ("<QUEUE>.dlq" unless --dlq
names another). Replayed messages go through the same inbox, so replaying a
message whose effect was committed is acked as a duplicate.`,
	}
	cmd.AddCommand(c.dlqListCmd(), c.dlqReplayCmd(), c.dlqPurgeCmd())
	return cmd
}

func dlqName(queue, override string) (string, error) {
	if !consumer.ValidName(queue) {
		return "", usagef("invalid queue name %q", queue)
	}
	if override == "" {
		return inboxtype.DeadLetterQueue(queue), nil
	}
	if !consumer.ValidName(override) {
		return "", usagef("invalid queue name %q", override)
	}
	return override, nil
}

// deadLetterView is one dead letter as dlq list prints it.
type deadLetterView struct {
	MessageID     string `json:"message_id"`
	Key           string `json:"key"`
	Error         string `json:"error"`
	Attempt       int    `json:"attempt"`
	ReplayCount   int    `json:"replay_count"`
	OriginalQueue string `json:"original_queue"`
	FirstFailedAt string `json:"first_failed_at"`
	LastFailedAt  string `json:"last_failed_at"`
	Bytes         int    `json:"bytes"`
}

// replayView is what dlq replay prints: consumer.ReplayResult and the
// queues it worked on.
type replayView struct {
	Queue           string `json:"queue"`
	DeadLetterQueue string `json:"dead_letter_queue"`
	Scanned         int    `json:"scanned"`
	Replayed        int    `json:"replayed"`
	Kept            int    `json:"kept"`
	Refused         int    `json:"refused"`
}

func (c *cli) dlqListCmd() *cobra.Command {
	var dlq string
	var limit int
	cmd := &cobra.Command{
		Use:   "list QUEUE",
		Short: "List dead letters of QUEUE without removing them",
		Long: `list shows up to --limit dead letters: message id, idempotency key, error
(reason: text), attempt, replay count and failure times. A message the
broker dead-lettered (it expired, was rejected or hit a limit in QUEUE)
shows the broker's reason, such as "expired (broker)". Messages are read
without acknowledgement and returned to the DLQ when list ends.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := dlqName(args[0], dlq)
			if err != nil {
				return err
			}
			if err := intFlagAtLeast("limit", limit, 0, "want a positive number of dead letters, or 0 for all"); err != nil {
				return err
			}
			conn, err := c.dialBroker()
			if err != nil {
				return err
			}
			defer conn.Close()
			peek, err := ops.PeekQueue(conn, name, limit, 0)
			if errors.Is(err, ops.ErrQueueNotFound) {
				return notFoundError{fmt.Errorf("dead-letter queue %s: %w", name, err)}
			}
			if err != nil {
				return err
			}
			views := make([]deadLetterView, 0, len(peek.DeadLetters))
			for _, d := range peek.DeadLetters {
				views = append(views, deadLetterView{
					MessageID: d.MessageID, Key: d.Key, Error: d.Error, Attempt: d.Attempt, ReplayCount: d.ReplayCount,
					OriginalQueue: d.OriginalQueue, FirstFailedAt: d.FirstFailedAt, LastFailedAt: d.LastFailedAt, Bytes: d.Bytes,
				})
			}
			out := map[string]any{"queue": name, "messages": peek.Messages, "dead_letters": views}
			return c.emit(out, func(w io.Writer) {
				fmt.Fprintf(w, "%s: %d messages\n", name, peek.Messages)
				if len(views) == 0 {
					return
				}
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "MESSAGE_ID\tKEY\tATTEMPT\tREPLAYS\tLAST_FAILED_AT\tERROR")
				for _, v := range views {
					fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", v.MessageID, v.Key, v.Attempt, v.ReplayCount, v.LastFailedAt, v.Error)
				}
				_ = tw.Flush()
			})
		},
	}
	cmd.Flags().StringVar(&dlq, "dlq", "", `dead-letter queue name (default "<QUEUE>.dlq")`)
	cmd.Flags().IntVar(&limit, "limit", 100, "most dead letters to show (0: all)")
	return cmd
}

func (c *cli) dlqReplayCmd() *cobra.Command {
	var (
		dlq, reason, key  string
		count, maxReplays int
	)
	cmd := &cobra.Command{
		Use:   "replay QUEUE",
		Short: "Move dead letters back to QUEUE",
		Long: `replay moves dead letters of QUEUE back to QUEUE (selected by --reason, the
prefix of the reason list shows, and --key), at most --count of them. Each
one is republished with confirm before it leaves the DLQ, with its body and
so its idempotency key unchanged: the inbox processes it at most once. A
message that expired goes back without its expiration. Messages replayed
--max-replays times already, and dead letters of another queue, stay in
the DLQ.`,
		Example: `  inboxctl dlq replay payments --reason exhausted --count 100
  inboxctl dlq replay payments --key payment:42`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := dlqName(args[0], dlq)
			if err != nil {
				return err
			}
			if err := intFlagAtLeast("count", count, 0, "want a positive number of messages, or 0 for all"); err != nil {
				return err
			}
			if err := intFlagAtLeast("max-replays", maxReplays, -1, "want a positive bound, 0 for the default (3) or -1 for no bound"); err != nil {
				return err
			}
			ctx, cancel := c.ctx(cmd)
			defer cancel()
			conn, err := c.dialBroker()
			if err != nil {
				return err
			}
			defer conn.Close()
			res, err := consumer.ReplayDLQ(ctx, conn, args[0], &consumer.ReplayOpts{
				Limit: count, Reason: reason, Key: key, MaxReplays: maxReplays, DeadLetterQueue: name,
			})
			if err != nil {
				return err
			}
			v := replayView{Queue: args[0], DeadLetterQueue: name, Scanned: res.Scanned, Replayed: res.Replayed, Kept: res.Kept, Refused: res.Refused}
			return c.emit(v, func(w io.Writer) {
				fmt.Fprintf(w, "replayed %d of %d scanned (kept %d, refused %d) from %s to %s\n",
					res.Replayed, res.Scanned, res.Kept, res.Refused, name, args[0])
			})
		},
	}
	cmd.Flags().StringVar(&dlq, "dlq", "", `dead-letter queue name (default "<QUEUE>.dlq")`)
	cmd.Flags().IntVar(&count, "count", 0, "most messages to replay (0: all)")
	cmd.Flags().StringVar(&reason, "reason", "", "only dead letters whose reason starts with this (exhausted, decode, expired...)")
	cmd.Flags().StringVar(&key, "key", "", "only the dead letters with this idempotency key")
	cmd.Flags().IntVar(&maxReplays, "max-replays", 0, "refuse messages replayed this often already (0: default 3, -1: no bound)")
	return cmd
}

func (c *cli) dlqPurgeCmd() *cobra.Command {
	var dlq string
	var yes bool
	cmd := &cobra.Command{
		Use:   "purge QUEUE --yes",
		Short: "Delete every dead letter of QUEUE",
		Long: `purge deletes every message in the dead-letter queue of QUEUE. It cannot be
undone; --yes is required.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := dlqName(args[0], dlq)
			if err != nil {
				return err
			}
			if !yes {
				return usagef("dlq purge deletes every message in %s: add --yes to confirm", name)
			}
			conn, err := c.dialBroker()
			if err != nil {
				return err
			}
			defer conn.Close()
			n, err := ops.PurgeQueue(conn, name)
			if errors.Is(err, ops.ErrQueueNotFound) {
				return notFoundError{fmt.Errorf("dead-letter queue %s does not exist", name)}
			}
			if err != nil {
				return err
			}
			return c.emit(map[string]any{"queue": name, "purged": n}, func(w io.Writer) {
				fmt.Fprintf(w, "purged %d messages from %s\n", n, name)
			})
		},
	}
	cmd.Flags().StringVar(&dlq, "dlq", "", `dead-letter queue name (default "<QUEUE>.dlq")`)
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm the deletion")
	return cmd
}
