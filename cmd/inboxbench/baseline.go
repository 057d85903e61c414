package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
)

// payment is the benchmark's payload: the payment-worker's shape.
type payment struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

const benchConsumer = "bench"

const (
	sqlInboxOne = `INSERT INTO inboxmq_inbox (consumer, key, status, fingerprint, attempts, message_id, completed_at)
VALUES ($1, $2, 'completed', $3, 1, $4, now()) ON CONFLICT (consumer, key) DO NOTHING`
	sqlPayment = `INSERT INTO bench_payments (order_id, amount_cents, currency) VALUES ($1, $2, $3)`
	sqlLedger  = `INSERT INTO bench_ledger (order_id, amount_cents) VALUES ($1, $2)`

	sqlInboxMany = `INSERT INTO inboxmq_inbox (consumer, key, status, fingerprint, attempts, completed_at)
SELECT $1, k, 'completed', f, 1, now() FROM unnest($2::text[], $3::bytea[]) AS t(k, f) ORDER BY k
ON CONFLICT (consumer, key) DO NOTHING RETURNING key`
	sqlPaymentsMany = `INSERT INTO bench_payments (order_id, amount_cents, currency)
SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[])`
	sqlLedgerMany = `INSERT INTO bench_ledger (order_id, amount_cents) SELECT * FROM unnest($1::text[], $2::bigint[])`
)

// publishedAt reads the benchmark's publish timestamp header.
func publishedAt(h amqp.Table) time.Time {
	if v, ok := h["x-bench-ts"].(int64); ok {
		return time.Unix(0, v)
	}
	return time.Time{}
}

// rawDrain is case (a): the broker's ceiling. One consumer, ack only.
func rawDrain(e *env) runner {
	return func(ctx context.Context, queue string, done func(time.Time)) (func() error, error) {
		ch, err := e.conn.Channel()
		if err != nil {
			return nil, err
		}
		if err := ch.Qos(512, 0, false); err != nil {
			return nil, err
		}
		msgs, err := ch.Consume(queue, "", false, false, false, false, nil)
		if err != nil {
			return nil, err
		}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range msgs {
				if err := d.Ack(false); err != nil {
					return
				}
				done(publishedAt(d.Headers))
			}
		}()
		return func() error { err := ch.Close(); wg.Wait(); return err }, nil
	}
}

// perMessageLoop is case (b): a hand-written amqp091 + pgx loop, one
// transaction per delivery (BEGIN, inbox insert, two business inserts,
// COMMIT), `workers` handlers.
func perMessageLoop(e *env, workers int) runner { return deliveryLoop(e, workers, handleOne) }

// deliveryLoop is a hand-written consumer: `workers` goroutines reading one
// channel's deliveries, each handled by handle and then acked alone
// (requeued on an error).
func deliveryLoop(e *env, workers int, handle func(context.Context, *env, amqp.Delivery) error) runner {
	return func(ctx context.Context, queue string, done func(time.Time)) (func() error, error) {
		ch, err := e.conn.Channel()
		if err != nil {
			return nil, err
		}
		if err := ch.Qos(2*workers, 0, false); err != nil {
			return nil, err
		}
		msgs, err := ch.Consume(queue, "", false, false, false, false, nil)
		if err != nil {
			return nil, err
		}
		var wg sync.WaitGroup
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for d := range msgs {
					if err := handle(ctx, e, d); err != nil {
						_ = d.Nack(false, true)
						continue
					}
					if err := d.Ack(false); err != nil {
						return
					}
					done(publishedAt(d.Headers))
				}
			}()
		}
		return func() error { err := ch.Close(); wg.Wait(); return err }, nil
	}
}

func handleOne(ctx context.Context, e *env, d amqp.Delivery) error {
	var p payment
	if err := json.Unmarshal(d.Body, &p); err != nil {
		return err
	}
	fp := sha256.Sum256(d.Body)
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	tag, err := tx.Exec(ctx, sqlInboxOne, benchConsumer, "payment:"+p.OrderID, fp[:], d.MessageId)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return nil // duplicate: nothing to do
	}
	if _, err := tx.Exec(ctx, sqlPayment, p.OrderID, p.AmountCents, p.Currency); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, sqlLedger, p.OrderID, p.AmountCents); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// batchedLoop is case (c): a hand-written loop that groups up to `size`
// deliveries (or `wait`) into one transaction — the batch's keys claimed in
// one statement in key order, the business rows in one multi-row statement
// each — with `inflight` batches at once.
func batchedLoop(e *env, size, inflight int, wait time.Duration) runner {
	return func(ctx context.Context, queue string, done func(time.Time)) (func() error, error) {
		ch, err := e.conn.Channel()
		if err != nil {
			return nil, err
		}
		if err := ch.Qos(2*size*inflight, 0, false); err != nil {
			return nil, err
		}
		msgs, err := ch.Consume(queue, "", false, false, false, false, nil)
		if err != nil {
			return nil, err
		}
		batches := make(chan []amqp.Delivery, inflight)
		var wg sync.WaitGroup
		wg.Go(func() { collect(msgs, batches, size, wait) })
		for range inflight {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for b := range batches {
					if err := handleBatch(ctx, e, b); err != nil {
						for _, d := range b {
							_ = d.Nack(false, true)
						}
						continue
					}
					for _, d := range b {
						_ = d.Ack(false)
						done(publishedAt(d.Headers))
					}
				}
			}()
		}
		return func() error { err := ch.Close(); wg.Wait(); return err }, nil
	}
}

func handleBatch(ctx context.Context, e *env, b []amqp.Delivery) error {
	keys := make([]string, 0, len(b))
	fps := make([][]byte, 0, len(b))
	byKey := make(map[string]payment, len(b))
	for _, d := range b {
		var p payment
		if err := json.Unmarshal(d.Body, &p); err != nil {
			return err
		}
		k := "payment:" + p.OrderID
		if _, dup := byKey[k]; dup {
			continue
		}
		fp := sha256.Sum256(d.Body)
		keys = append(keys, k)
		fps = append(fps, fp[:])
		byKey[k] = p
	}
	return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sqlInboxMany, benchConsumer, keys, fps)
		if err != nil {
			return err
		}
		claimed, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		if len(claimed) == 0 {
			return nil
		}
		ids := make([]string, len(claimed))
		amounts := make([]int64, len(claimed))
		cur := make([]string, len(claimed))
		for i, k := range claimed {
			p := byKey[k]
			ids[i], amounts[i], cur[i] = p.OrderID, p.AmountCents, p.Currency
		}
		var batch pgx.Batch
		batch.Queue(sqlPaymentsMany, ids, amounts, cur)
		batch.Queue(sqlLedgerMany, ids, amounts)
		return tx.SendBatch(ctx, &batch).Close()
	})
}

var errTimeout = errors.New("inboxbench: timed out")

func fmtRate(v float64) string { return fmt.Sprintf("%.0f", v) }
