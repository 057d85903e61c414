package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"

	"github.com/inboxmq/inboxmq/consumer"
)

// summary is what publish reports and report checks.
type summary struct {
	RunID        string `json:"run_id"`
	Queue        string `json:"queue"`
	Published    int    `json:"published"`
	UniqueOrders int    `json:"unique_orders"`
	ValidCopies  int    `json:"valid_copies"`
	Invalid      int    `json:"invalid"`
	// StartedAt is when publishing began (the report's throughput clock).
	StartedAt time.Time `json:"started_at"`
}

// burst builds the demo's messages: orders orders, each published 1 to
// maxCopies times under different message ids, plus invalid invalid
// messages, shuffled so that copies of one order interleave.
func burst(runID string, orders, maxCopies, invalid int) ([]amqp.Publishing, summary) {
	s := summary{RunID: runID, UniqueOrders: orders, Invalid: invalid}
	var msgs []amqp.Publishing
	for i := range orders {
		body, _ := json.Marshal(Payment{
			OrderID:     fmt.Sprintf("%s-%05d", runID, i),
			AmountCents: int64(100 + mrand.IntN(99_900)),
			Currency:    "EUR",
		})
		for range 1 + mrand.IntN(max(maxCopies, 1)) {
			msgs = append(msgs, amqp.Publishing{Body: body})
			s.ValidCopies++
		}
	}
	bad := []string{
		`{not json`,
		`{"amount_cents": 500, "currency": "EUR"}`,
		`{"order_id": "%s-bad-amount", "amount_cents": 0, "currency": "EUR"}`,
		`{"order_id": "%s-bad-currency", "amount_cents": 500, "currency": "EURO"}`,
		`{"order_id": "%s-negative", "amount_cents": -5, "currency": "EUR"}`,
	}
	for i := range invalid {
		b := bad[i%len(bad)]
		if i%len(bad) >= 2 {
			b = fmt.Sprintf(b, runID+"-"+strconv.Itoa(i))
		}
		msgs = append(msgs, amqp.Publishing{Body: []byte(b)})
	}
	mrand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	for i := range msgs {
		msgs[i].MessageId = newID()
		msgs[i].ContentType = "application/json"
		msgs[i].DeliveryMode = amqp.Persistent
	}
	s.Published = len(msgs)
	return msgs, s
}

func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// publishAll publishes msgs to queue through the default exchange with
// publisher confirms, waiting for every confirm.
func publishAll(ctx context.Context, amqpURL, queue string, msgs []amqp.Publishing) error {
	conn, _, err := consumer.Dial(ctx, amqpURL, &consumer.DialOpts{Name: "payment-worker publish"})
	if err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("publish: channel: %w", err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("publish: confirm mode: %w", err)
	}
	const window = 256
	pending := make([]*amqp.DeferredConfirmation, 0, window)
	flush := func() error {
		for _, dc := range pending {
			ok, err := dc.WaitContext(ctx)
			if err != nil {
				return fmt.Errorf("publish: confirm: %w", err)
			}
			if !ok {
				return fmt.Errorf("publish: broker nacked message %d", dc.DeliveryTag)
			}
		}
		pending = pending[:0]
		return nil
	}
	for _, m := range msgs {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, m)
		if err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		pending = append(pending, dc)
		if len(pending) == window {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

// purge empties queue and its DLQ so that a demo run counts only its own
// dead letters. The queues must exist (the worker declares them).
func purge(amqpURL, queue string) error {
	conn, _, err := consumer.Dial(context.Background(), amqpURL, &consumer.DialOpts{Name: "payment-worker purge"})
	if err != nil {
		return fmt.Errorf("purge: %w", err)
	}
	defer conn.Close()
	for _, q := range []string{queue, queue + ".dlq"} {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("purge: channel: %w", err)
		}
		_, err = ch.QueuePurge(q, false)
		_ = ch.Close()
		if err != nil {
			return fmt.Errorf("purge %s (start the worker first; it declares the queues): %w", q, err)
		}
	}
	return nil
}

func newPublishCmd() *cobra.Command {
	var (
		orders, maxCopies, invalid int
		runID, summaryPath         string
		doPurge                    bool
	)
	cmd := &cobra.Command{
		Use:   "publish",
		Short: "Demo: publish a burst of orders (each 1..N times, different message ids) plus invalid ones",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := configFromEnv(getenv)
			if err != nil {
				return err
			}
			if runID == "" {
				runID = "demo-" + strconv.FormatInt(time.Now().Unix(), 36) + "-" + newID()[:6]
			}
			if doPurge {
				if err := purge(cfg.AMQPURL, cfg.Queue); err != nil {
					return err
				}
			}
			msgs, s := burst(runID, orders, maxCopies, invalid)
			s.Queue = cfg.Queue
			s.StartedAt = time.Now()
			if err := publishAll(cmd.Context(), cfg.AMQPURL, cfg.Queue, msgs); err != nil {
				return err
			}
			out, _ := json.Marshal(s)
			if summaryPath != "" {
				if err := os.WriteFile(summaryPath, out, 0o600); err != nil {
					return fmt.Errorf("publish: write summary: %w", err)
				}
			}
			fmt.Fprintln(cmd.OutOrStdout(), string(out))
			return nil
		},
	}
	cmd.Flags().IntVar(&orders, "orders", 500, "number of distinct orders")
	cmd.Flags().IntVar(&maxCopies, "max-copies", 3, "each order is published 1..max-copies times")
	cmd.Flags().IntVar(&invalid, "invalid", 5, "number of invalid messages")
	cmd.Flags().StringVar(&runID, "run-id", "", "order id prefix (default: fresh per run)")
	cmd.Flags().StringVar(&summaryPath, "summary", "", "also write the JSON summary to this file")
	cmd.Flags().BoolVar(&doPurge, "purge", false, "purge the queue and its DLQ first")
	return cmd
}
