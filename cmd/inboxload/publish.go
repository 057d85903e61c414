package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/producer"
)

// payment is the payment-worker's payload.
type payment struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// IdempotencyKey is the worker's key, "payment:" + order_id.
func (p payment) IdempotencyKey() string { return "payment:" + p.OrderID }

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

// outgoing is one message of a burst: a valid order, published typed with
// producer.Publish, or an invalid body, published as is with
// Producer.Send.
type outgoing struct {
	payment *payment
	raw     []byte
	// id is the message id. Every copy of an order gets an id of its own:
	// the inbox deduplicates by the key in the payload, never by the id.
	id string
}

// burst builds the messages of a run: orders orders, each published 1 to
// maxCopies times under different message ids, plus invalid invalid
// messages, shuffled so that copies of one order interleave.
func burst(runID string, orders, maxCopies, invalid int) ([]outgoing, summary) {
	s := summary{RunID: runID, UniqueOrders: orders, Invalid: invalid}
	var msgs []outgoing
	for i := range orders {
		p := &payment{
			OrderID:     fmt.Sprintf("%s-%05d", runID, i),
			AmountCents: int64(100 + mrand.IntN(99_900)),
			Currency:    "EUR",
		}
		for range 1 + mrand.IntN(max(maxCopies, 1)) {
			msgs = append(msgs, outgoing{payment: p})
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
		msgs = append(msgs, outgoing{raw: []byte(b)})
	}
	mrand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	for i := range msgs {
		msgs[i].id = newID()
	}
	s.Published = len(msgs)
	return msgs, s
}

func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// publishers is how many publishes are kept in flight at once.
const publishers = 16

// publishTo publishes msgs with package producer (persistent, confirmed,
// mandatory, retried across a lost connection), publishers at a time: to
// queue through the default exchange, or with ordered to the ordered
// route's exchange (named after queue) with each payment's order id as
// routing key, so that an order's payments share a shard and keep their
// order. It returns the first error.
func publishTo(ctx context.Context, amqpURL, queue string, ordered bool, msgs []outgoing) error {
	exchange, key := "", func(outgoing) string { return queue }
	if ordered {
		exchange = queue
		key = func(m outgoing) string {
			if m.payment != nil {
				return m.payment.OrderID
			}
			return m.id
		}
	}
	p, err := producer.New(&producer.Config{URL: amqpURL, ConnectionName: "inboxload publish"})
	if err != nil {
		return fmt.Errorf("inboxload: publish: %w", err)
	}
	defer p.Close()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan outgoing)
	var wg sync.WaitGroup
	for range publishers {
		wg.Go(func() {
			for m := range next {
				var err error
				if m.payment != nil {
					err = producer.Publish(ctx, p, exchange, key(m), *m.payment, &producer.PublishOpts{MessageID: m.id})
				} else {
					err = p.Send(ctx, &producer.Message{Exchange: exchange, RoutingKey: key(m), ID: m.id, ContentType: "application/json", Body: m.raw})
				}
				if err != nil {
					cancel(err)
				}
			}
		})
	}
	for _, m := range msgs {
		select {
		case next <- m:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("inboxload: publish: %w", err)
	}
	return ctx.Err()
}

// purge empties queue and its DLQ so that a run counts only its own dead
// letters. The queues must exist (the worker declares them).
func purge(ctx context.Context, amqpURL, queue string) error {
	conn, _, err := consumer.Dial(ctx, amqpURL, &consumer.DialOpts{Name: "inboxload purge"})
	if err != nil {
		return fmt.Errorf("inboxload: purge: %w", err)
	}
	defer conn.Close()
	for _, q := range []string{queue, inboxtype.DeadLetterQueue(queue)} {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("inboxload: purge: channel: %w", err)
		}
		_, err = ch.QueuePurge(q, false)
		_ = ch.Close()
		if err != nil {
			return fmt.Errorf("inboxload: purge %s (start the worker first; it declares the queues): %w", q, err)
		}
	}
	return nil
}

// publishCmd is `inboxload publish`: it publishes a burst and prints its
// summary as JSON (and writes it to --summary).
func publishCmd(ctx context.Context, cfg config, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("inboxload publish", flag.ContinueOnError)
	orders := fs.Int("orders", 500, "number of distinct orders")
	maxCopies := fs.Int("max-copies", 3, "each order is published 1..max-copies times")
	invalid := fs.Int("invalid", 5, "number of invalid messages")
	runID := fs.String("run-id", "", "order id prefix (default: fresh per run)")
	summaryPath := fs.String("summary", "", "also write the JSON summary to this file")
	doPurge := fs.Bool("purge", false, "purge the queue and its DLQ first")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("inboxload: publish: %w", err)
	}
	if *runID == "" {
		*runID = "demo-" + strconv.FormatInt(time.Now().Unix(), 36) + "-" + newID()[:6]
	}
	if *doPurge {
		if err := purge(ctx, cfg.AMQPURL, cfg.Queue); err != nil {
			return err
		}
	}
	msgs, s := burst(*runID, *orders, *maxCopies, *invalid)
	s.Queue = cfg.Queue
	s.StartedAt = time.Now()
	if err := publishTo(ctx, cfg.AMQPURL, cfg.Queue, cfg.OrderedShards > 0, msgs); err != nil {
		return err
	}
	raw, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("inboxload: publish: %w", err)
	}
	if *summaryPath != "" {
		if err := os.WriteFile(*summaryPath, raw, 0o600); err != nil {
			return fmt.Errorf("inboxload: publish: write summary: %w", err)
		}
	}
	_, err = fmt.Fprintln(out, string(raw))
	return err
}
