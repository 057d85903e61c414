package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/outbox"
)

// The full chain by hand: cases (pc), one transaction per delivery, and
// (pgc), 64 per transaction — the ceilings of (p) and (pg). Both do (p)'s
// work the fastest way we know to write it directly against amqp091, pgx
// and go-redis: the completed-cache read, the inbox row with the result,
// the payment, the ledger entry and the outbox row in one transaction, the
// ack after the commit, the cache written; and the event published with a
// confirm that nobody waits for — a confirm listener marks the row sent
// once the broker has it, as the outbox relay does, so the delivery's ack
// does not wait for the event (its row is durable).

const (
	sqlChainInboxMany = `INSERT INTO inboxmq_inbox (consumer, key, status, fingerprint, attempts, message_id, completed_at, result)
SELECT $1, k, 'completed', f, 1, m, now(), r FROM unnest($2::text[], $3::bytea[], $4::text[], $5::jsonb[]) AS t(k, f, m, r) ORDER BY k
ON CONFLICT (consumer, key) DO NOTHING RETURNING key`
	sqlChainOutboxMany = `INSERT INTO inboxmq_outbox (message_id, exchange, routing_key, headers, content_type, body, idempotency_key)
SELECT id, $1, $2, h, 'application/json', b, k FROM unnest($3::text[], $4::jsonb[], $5::bytea[], $6::text[]) AS t(id, h, b, k)
RETURNING id, message_id`
)

// eventPublisher publishes events on a channel in confirm mode without
// waiting for the confirms: its listener hands each confirmed event's
// outbox row id to the marker. A nacked event's row stays pending.
type eventPublisher struct {
	ch   *amqp.Channel
	mu   sync.Mutex
	rows map[uint64]int64 // publish sequence number → outbox row id
	done chan struct{}
}

func (e *env) newEventPublisher(marks chan<- int64) (*eventPublisher, error) {
	ch, err := e.conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	p := &eventPublisher{ch: ch, rows: make(map[uint64]int64), done: make(chan struct{})}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1024))
	go func() {
		defer close(p.done)
		for c := range confirms {
			p.mu.Lock()
			id := p.rows[c.DeliveryTag]
			delete(p.rows, c.DeliveryTag)
			p.mu.Unlock()
			if c.Ack {
				marks <- id
			}
		}
	}()
	return p, nil
}

// publish sends the event of outbox row id.
func (p *eventPublisher) publish(ctx context.Context, id int64, msg amqp.Publishing) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rows[p.ch.GetNextPublishSeqNo()] = id
	return p.ch.PublishWithContext(ctx, eventsExchange, eventRoutingKey, false, false, msg)
}

// close closes the channel once its listener has handed on every confirm.
func (p *eventPublisher) close() {
	_ = p.ch.Close()
	<-p.done
}

// chainEventOf returns what (p)'s handler derives from a payment: the
// event's body, id and outbox headers, and the stored result.
func chainEventOf(p payment) (body []byte, id, headers string, res []byte, err error) {
	key := p.IdempotencyKey()
	body, err = json.Marshal(chainEvent{OrderID: p.OrderID, AmountCents: p.AmountCents, Currency: p.Currency, Status: "completed"})
	if err != nil {
		return nil, "", "", nil, err
	}
	res, err = json.Marshal(chainResult{OrderID: p.OrderID, Status: "completed"})
	if err != nil {
		return nil, "", "", nil, err
	}
	id = outbox.DeriveID(eventsExchange, eventRoutingKey, key)
	headers = `{"` + inboxtype.HeaderIdempotencyKey + `":{"t":"string","v":` + strconv.Quote(key) + `}}`
	return body, id, headers, res, nil
}

func chainCacheKey(key string) string { return benchName + ":pc:done:" + key }

// eventMessage is the event as the relay publishes it.
func eventMessage(id, key string, body []byte) amqp.Publishing {
	return amqp.Publishing{
		DeliveryMode: amqp.Persistent, ContentType: "application/json", MessageId: id,
		Headers: amqp.Table{inboxtype.HeaderIdempotencyKey: key}, Body: body,
	}
}

// chainLoop is case (pc): per delivery, as (p) at the worker's defaults
// (the completed-cache, no lock), with `workers` handlers:
//
//  1. Redis: GET completed-cache;
//  2. PostgreSQL, one batch: BEGIN, inbox row with the result, payment,
//     ledger entry, outbox row (RETURNING id), COMMIT;
//  3. the event published, its confirm not awaited (eventPublisher);
//  4. Redis: SET completed-cache;
//  5. ack.
func chainLoop(e *env, workers int) runner {
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
		marks := make(chan int64, 4*workers)
		var markers sync.WaitGroup
		markers.Go(func() { e.markSent(marks) })
		var wg sync.WaitGroup
		pubs := make([]*eventPublisher, workers)
		for i := range pubs {
			pub, err := e.newEventPublisher(marks)
			if err != nil {
				return nil, err
			}
			pubs[i] = pub
			wg.Go(func() {
				for d := range msgs {
					err := chainOne(ctx, e, pub, d)
					if err != nil && !errors.Is(err, errChainDuplicate) {
						_ = d.Nack(false, true)
						continue
					}
					if err := d.Ack(false); err != nil {
						return
					}
					done(publishedAt(d.Headers))
				}
			})
		}
		return func() error {
			err := ch.Close()
			wg.Wait()
			for _, p := range pubs {
				p.close()
			}
			close(marks)
			markers.Wait()
			return err
		}, nil
	}
}

func chainOne(ctx context.Context, e *env, pub *eventPublisher, d amqp.Delivery) error {
	var p payment
	if err := json.Unmarshal(d.Body, &p); err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return err
	}
	key := p.IdempotencyKey()
	switch err := e.redis.Get(ctx, chainCacheKey(key)).Err(); {
	case err == nil:
		return errChainDuplicate
	case !errors.Is(err, redis.Nil):
		return err
	}
	event, eventID, headers, res, err := chainEventOf(p)
	if err != nil {
		return err
	}
	fp := sha256.Sum256(d.Body)
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	var b pgx.Batch
	b.Queue("BEGIN")
	b.Queue(sqlChainInbox, benchConsumer, key, fp[:], d.MessageId, string(res))
	b.Queue(sqlPayment, p.OrderID, p.AmountCents, p.Currency)
	b.Queue(sqlLedger, p.OrderID, p.AmountCents)
	b.Queue(sqlChainOutbox, eventID, eventsExchange, eventRoutingKey, headers, event, key)
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, &b)
	var rowID int64
	_, err = br.Exec()
	if err == nil {
		var tag interface{ RowsAffected() int64 }
		tag, err = br.Exec()
		if err == nil && tag.RowsAffected() == 0 {
			err = errChainDuplicate // the payment's primary key aborts the rest
		}
	}
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		err = br.QueryRow().Scan(&rowID)
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		conn.Release()
		return err
	}
	conn.Release()
	if err := pub.publish(ctx, rowID, eventMessage(eventID, key, event)); err != nil {
		return err // the row stays pending: a relay would publish it
	}
	_ = e.redis.Set(context.WithoutCancel(ctx), chainCacheKey(key), res, chainCacheTTL).Err()
	return nil
}

// chainBatchedLoop is case (pgc): (pc)'s work batched as (c) batches (b)'s
// — up to `size` deliveries (or `wait`) per transaction, `inflight`
// batches at once. Per batch:
//
//  1. Redis: one MGET of the completed-cache;
//  2. PostgreSQL: BEGIN and the batch's inbox rows (with results) in one
//     statement in key order; then the payments, the ledger entries and
//     the outbox rows (RETURNING id) as multi-row inserts in one pipeline;
//     COMMIT;
//  3. the events published, their confirms not awaited (eventPublisher);
//  4. Redis: the cache written in one pipeline;
//  5. the acks.
func chainBatchedLoop(e *env, size, inflight int, wait time.Duration) runner {
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
		marks := make(chan int64, 4*size)
		var markers sync.WaitGroup
		markers.Go(func() { e.markSent(marks) })
		batches := make(chan []amqp.Delivery, inflight)
		var wg sync.WaitGroup
		wg.Go(func() { collect(msgs, batches, size, wait) })
		pubs := make([]*eventPublisher, inflight)
		for i := range pubs {
			pub, err := e.newEventPublisher(marks)
			if err != nil {
				return nil, err
			}
			pubs[i] = pub
			wg.Go(func() {
				for b := range batches {
					if err := chainBatch(ctx, e, pub, b); err != nil {
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
			})
		}
		return func() error {
			err := ch.Close()
			wg.Wait()
			for _, p := range pubs {
				p.close()
			}
			close(marks)
			markers.Wait()
			return err
		}, nil
	}
}

// collect groups deliveries into batches of up to size, a batch going
// out when full or wait after its first delivery.
func collect(msgs <-chan amqp.Delivery, batches chan<- []amqp.Delivery, size int, wait time.Duration) {
	defer close(batches)
	timer := time.NewTimer(time.Hour)
	var cur []amqp.Delivery
	flush := func() {
		if len(cur) > 0 {
			batches <- cur
			cur = nil
		}
	}
	for {
		select {
		case d, ok := <-msgs:
			if !ok {
				flush()
				return
			}
			if len(cur) == 0 {
				timer.Reset(wait)
			}
			cur = append(cur, d)
			if len(cur) >= size {
				flush()
			}
		case <-timer.C:
			flush()
		}
	}
}

// chainEntry is one payment of a (pgc) batch.
type chainEntry struct {
	p                     payment
	key, eventID, headers string
	fp                    []byte
	event, res            []byte
	messageID             string
}

func chainBatch(ctx context.Context, e *env, pub *eventPublisher, b []amqp.Delivery) error {
	entries := make([]chainEntry, 0, len(b))
	seen := make(map[string]bool, len(b))
	cacheKeys := make([]string, 0, len(b))
	for _, d := range b {
		var p payment
		if err := json.Unmarshal(d.Body, &p); err != nil {
			return err
		}
		if err := p.Validate(); err != nil {
			return err
		}
		key := p.IdempotencyKey()
		if seen[key] {
			continue
		}
		seen[key] = true
		event, eventID, headers, res, err := chainEventOf(p)
		if err != nil {
			return err
		}
		fp := sha256.Sum256(d.Body)
		entries = append(entries, chainEntry{p: p, key: key, eventID: eventID, headers: headers, fp: fp[:], event: event, res: res, messageID: d.MessageId})
		cacheKeys = append(cacheKeys, chainCacheKey(key))
	}
	cached, err := e.redis.MGet(ctx, cacheKeys...).Result()
	if err != nil {
		return err
	}
	todo := entries[:0]
	for i, en := range entries {
		if cached[i] == nil {
			todo = append(todo, en)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	n := len(todo)
	keys, msgIDs, results := make([]string, n), make([]string, n), make([]string, n)
	fps := make([][]byte, n)
	byKey := make(map[string]*chainEntry, n)
	for i := range todo {
		en := &todo[i]
		keys[i], fps[i], msgIDs[i], results[i] = en.key, en.fp, en.messageID, string(en.res)
		byKey[en.key] = en
	}
	var published []*chainEntry
	var rowIDs map[string]int64 // outbox row id by event id
	err = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sqlChainInboxMany, benchConsumer, keys, fps, msgIDs, results)
		if err != nil {
			return err
		}
		claimed, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(claimed) == 0 {
			return err
		}
		m := len(claimed)
		ids, currencies, eventIDs, hdrs, keysOut := make([]string, m), make([]string, m), make([]string, m), make([]string, m), make([]string, m)
		amounts := make([]int64, m)
		bodies := make([][]byte, m)
		published = make([]*chainEntry, m)
		for i, k := range claimed {
			en := byKey[k]
			published[i] = en
			ids[i], amounts[i], currencies[i] = en.p.OrderID, en.p.AmountCents, en.p.Currency
			eventIDs[i], hdrs[i], bodies[i], keysOut[i] = en.eventID, en.headers, en.event, en.key
		}
		var batch pgx.Batch
		batch.Queue(sqlPaymentsMany, ids, amounts, currencies)
		batch.Queue(sqlLedgerMany, ids, amounts)
		batch.Queue(sqlChainOutboxMany, eventsExchange, eventRoutingKey, eventIDs, hdrs, bodies, keysOut)
		br := tx.SendBatch(ctx, &batch)
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return err
		}
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return err
		}
		rows, err = br.Query()
		if err == nil {
			rowIDs = make(map[string]int64, m)
			var id int64
			var mid string
			_, err = pgx.ForEachRow(rows, []any{&id, &mid}, func() error {
				rowIDs[mid] = id
				return nil
			})
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err
	})
	if err != nil {
		return err
	}
	for _, en := range published {
		if err := pub.publish(ctx, rowIDs[en.eventID], eventMessage(en.eventID, en.key, en.event)); err != nil {
			return err // the rows stay pending: a relay would publish them
		}
	}
	pipe := e.redis.Pipeline()
	for _, en := range published {
		pipe.Set(context.WithoutCancel(ctx), chainCacheKey(en.key), en.res, chainCacheTTL)
	}
	_, _ = pipe.Exec(context.WithoutCancel(ctx))
	return nil
}
