package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/outbox"
)

// The hand loop's shape: 8 handlers behind a prefetch of 16, as
// cmd/inboxbench's (b).
const (
	handWorkers  = 8
	handPrefetch = 2 * handWorkers
	// handConsumer is the hand loop's inbox namespace (column consumer).
	handConsumer = "benchexample"
)

// The statements of one delivery: the payment-worker's writes (its
// queuePayment and outbox.AddToBatch's insert), the inbox claim as
// cmd/inboxbench's (b) writes it.
const (
	sqlInbox = `INSERT INTO inboxmq_inbox (consumer, key, status, fingerprint, attempts, message_id, completed_at)
VALUES ($1, $2, 'completed', $3, 1, $4, now()) ON CONFLICT (consumer, key) DO NOTHING`
	sqlPayment = `INSERT INTO payments (order_id, amount_cents, currency) VALUES ($1, $2, $3)`
	sqlLedger  = `INSERT INTO ledger_entries (order_id, amount_cents) VALUES ($1, $2) RETURNING id`
	sqlOutbox  = `INSERT INTO inboxmq_outbox (message_id, exchange, routing_key, headers, content_type, body, idempotency_key)
VALUES ($1, $2, $3, $4, 'application/json', $5, $6) ON CONFLICT (message_id) DO NOTHING`
)

// event is the body of the payment.completed event the worker enqueues.
type event struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Status      string `json:"status"`
}

// handLoop is a consumer written directly against amqp091 and pgx.
type handLoop struct {
	pool   *pgxpool.Pool
	conn   *amqp.Connection
	ch     *amqp.Channel
	events string
	wg     sync.WaitGroup
}

// startHandLoop connects to f's services and consumes f's queue with
// handWorkers goroutines, each delivery decoded, written in one
// transaction (BEGIN, inbox row, payment, ledger entry, outbox row,
// COMMIT: a round trip each) and acked after the commit; a failed
// delivery is requeued.
func startHandLoop(ctx context.Context, f *fixture) (*handLoop, error) {
	cfg, err := pgxpool.ParseConfig(f.dbURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 2 * handWorkers // as the worker's pool at 8 handlers
	h := &handLoop{events: f.events}
	if h.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, err
	}
	if h.conn, err = amqp.Dial(f.b.amqpURL); err != nil {
		h.pool.Close()
		return nil, err
	}
	msgs, err := h.consume(f.queue)
	if err != nil {
		_ = h.stop()
		return nil, err
	}
	for range handWorkers {
		h.wg.Go(func() {
			for d := range msgs {
				if err := h.handle(ctx, d); err != nil {
					_ = d.Nack(false, true)
					continue
				}
				if err := d.Ack(false); err != nil {
					return
				}
			}
		})
	}
	return h, nil
}

func (h *handLoop) consume(queue string) (<-chan amqp.Delivery, error) {
	var err error
	if h.ch, err = h.conn.Channel(); err != nil {
		return nil, err
	}
	if err := h.ch.Qos(handPrefetch, 0, false); err != nil {
		return nil, err
	}
	return h.ch.Consume(queue, "", false, false, false, false, nil)
}

// handle writes one delivery's payment in one transaction; a copy whose
// key is already in the inbox writes nothing (and is acked).
func (h *handLoop) handle(ctx context.Context, d amqp.Delivery) error {
	var p payment
	if err := json.Unmarshal(d.Body, &p); err != nil {
		return err
	}
	key := "payment:" + p.OrderID
	fp := sha256.Sum256(fmt.Appendf(nil, "%d:%s|%d|%s", len(p.OrderID), p.OrderID, p.AmountCents, strings.ToUpper(p.Currency)))
	body, err := json.Marshal(event{OrderID: p.OrderID, AmountCents: p.AmountCents, Currency: p.Currency, Status: "completed"})
	if err != nil {
		return err
	}
	headers := `{"` + inboxtype.HeaderIdempotencyKey + `":{"t":"string","v":` + strconv.Quote(key) + `}}`
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	tag, err := tx.Exec(ctx, sqlInbox, handConsumer, key, fp[:], d.MessageId)
	if err != nil || tag.RowsAffected() == 0 {
		return err // nil: a duplicate, nothing to write
	}
	if _, err := tx.Exec(ctx, sqlPayment, p.OrderID, p.AmountCents, p.Currency); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, sqlLedger, p.OrderID, p.AmountCents); err != nil {
		return err
	}
	id := outbox.DeriveID(h.events, "payment.completed", key)
	if _, err := tx.Exec(ctx, sqlOutbox, id, h.events, "payment.completed", headers, body, key); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// stop closes the channel (the broker requeues what is not acked), waits
// for the handlers and closes the connections.
func (h *handLoop) stop() error {
	var err error
	if h.ch != nil {
		err = h.ch.Close()
	}
	h.wg.Wait()
	err = errors.Join(err, h.conn.Close())
	h.pool.Close()
	return err
}
