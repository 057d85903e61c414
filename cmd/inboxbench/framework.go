package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/middleware"
)

// IdempotencyKey makes payment a inboxtype.Keyer: the business identity.
func (p payment) IdempotencyKey() string { return "payment:" + p.OrderID }

// Validate makes payment a inboxtype.Validator.
func (p payment) Validate() error {
	if p.OrderID == "" || p.AmountCents <= 0 {
		return errors.New("invalid payment")
	}
	return nil
}

// writePayment is the business write of every inboxmq case: the same two
// statements the hand-written per-message loop sends.
func writePayment(ctx context.Context, tx pgx.Tx, p payment) error {
	if _, err := tx.Exec(ctx, sqlPayment, p.OrderID, p.AmountCents, p.Currency); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, sqlLedger, p.OrderID, p.AmountCents)
	return err
}

// queuePayment queues writePayment's statements on b (case (eb)).
func queuePayment(b *pgx.Batch, p payment) {
	b.Queue(sqlPayment, p.OrderID, p.AmountCents, p.Currency)
	b.Queue(sqlLedger, p.OrderID, p.AmountCents)
}

// doneObserver reports every acked delivery to the benchmark.
type doneObserver struct {
	inboxtype.NopObserver
	done func(time.Time)
}

func (o doneObserver) OnOutcome(d *inboxtype.Delivery, out inboxtype.Outcome) {
	if out.Action == inboxtype.ActionAcked {
		o.done(publishedAt(d.Headers))
	}
}

// claimCase registers the claim handler of (f) and (h), with opts and
// queue settings q; withLock puts it behind the Redis lock (fl), as
// RouteOpts.Lock does.
func claimCase(e *env, gc *inbox.GroupCommit, q consumer.QueueOpts, withLock bool) runner {
	return inboxmqCase(e, func(store *inbox.Store, r *consumer.Router, queue string) {
		var mw []inboxtype.Middleware
		if withLock {
			lck, err := middleware.Lock(e.redis, &middleware.LockOpts{Prefix: "inboxbench:lock:"})
			if err != nil {
				panic(err) // fixed, valid options: a programming error, like Register's
			}
			mw = append(mw, lck)
		}
		consumer.Register(r, queue, inbox.ClaimHandler(store, func(ctx context.Context, c *inbox.Claim, m *inboxtype.Message[payment]) error {
			// the outside call would carry c.Key as Idempotency-Key here
			return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error { return writePayment(ctx, tx, m.Body) })
		}, gc, nil), &consumer.HandlerOpts{
			Namespace:  benchConsumer,
			Middleware: mw,
			Queue:      q,
		})
	})
}

// groupCommit is the group commit of cases (e) and (h).
func (e *env) groupCommit() *inbox.GroupCommit {
	return &inbox.GroupCommit{MaxBatch: e.batch, MaxWait: e.maxWait, MaxInFlight: e.inflight}
}

// groupQueue is the queue settings of cases (e) and (h): enough handlers
// to fill every batch in flight, and twice that prefetched, on a queue of
// type typ.
func (e *env) groupQueue(typ consumer.QueueType) consumer.QueueOpts {
	return consumer.QueueOpts{Type: typ, Concurrency: e.inflight * e.batch, Prefetch: 2 * e.inflight * e.batch, DeliveryLimit: benchDeliveryLimit}
}

// frameworkCases returns the inboxmq cases (d), (e), (f), (fl) and (h) on a
// queue of type typ; on a quorum queue their ids get the suffix "q".
func frameworkCases(e *env, typ consumer.QueueType) []benchCase {
	suffix, on := "", ""
	if typ == consumer.Quorum {
		suffix, on = "q", ", quorum queue"
	}
	perMessage := consumer.QueueOpts{Type: typ, Concurrency: e.workers, DeliveryLimit: benchDeliveryLimit}
	return []benchCase{
		{"d" + suffix, fmt.Sprintf("inboxmq per-message transactional mode, %d handlers%s", e.workers, on), typ, inboxmqCase(e, func(store *inbox.Store, r *consumer.Router, q string) {
			consumer.Register(r, q, inbox.Handler(store, func(ctx context.Context, tx pgx.Tx, m *inboxtype.Message[payment]) error {
				return writePayment(ctx, tx, m.Body)
			}, nil), &consumer.HandlerOpts{Namespace: benchConsumer, Queue: perMessage})
		}), nil},
		{"e" + suffix, fmt.Sprintf("inboxmq group commit (%d per tx, %d in flight)%s", e.batch, e.inflight, on), typ, inboxmqCase(e, func(store *inbox.Store, r *consumer.Router, q string) {
			consumer.Register(r, q, inbox.Handler(store, func(ctx context.Context, tx pgx.Tx, m *inboxtype.Message[payment]) error {
				return writePayment(ctx, tx, m.Body)
			}, e.groupCommit()),
				&consumer.HandlerOpts{Namespace: benchConsumer, Queue: e.groupQueue(typ)})
		}), nil},
		{"eb" + suffix, fmt.Sprintf("inboxmq group commit through BatchHandler (HandleBatch; %d per tx, %d in flight)%s", e.batch, e.inflight, on), typ, inboxmqCase(e, func(store *inbox.Store, r *consumer.Router, q string) {
			consumer.Register(r, q, inbox.BatchHandler(store, func(ctx context.Context, b *pgx.Batch, m *inboxtype.Message[payment]) error {
				queuePayment(b, m.Body)
				return nil
			}, e.groupCommit()),
				&consumer.HandlerOpts{Namespace: benchConsumer, Queue: e.groupQueue(typ)})
		}), nil},
		{"f" + suffix, fmt.Sprintf("inboxmq claim mode, %d handlers%s", e.workers, on), typ,
			claimCase(e, nil, perMessage, false), nil},
		{"fl" + suffix, fmt.Sprintf("inboxmq claim mode + Redis lock (RouteOpts.Lock), %d handlers%s", e.workers, on), typ,
			claimCase(e, nil, perMessage, true), nil},
		{"h" + suffix, "inboxmq claim mode, completions group-committed as (e)" + on, typ,
			claimCase(e, e.groupCommit(), e.groupQueue(typ), false), nil},
	}
}

func inboxmqCase(e *env, register func(store *inbox.Store, r *consumer.Router, queue string)) runner {
	return func(ctx context.Context, queue string, done func(time.Time)) (func() error, error) {
		store, err := inbox.NewStore(e.pool, nil)
		if err != nil {
			return nil, err
		}
		if err := store.Check(ctx); err != nil {
			return nil, err
		}
		// Started, as a worker's store is: claims name its owner session.
		if err := store.Start(ctx); err != nil {
			return nil, err
		}
		r := consumer.NewRouter()
		register(store, r, queue)
		c, err := consumer.New(&consumer.Config{
			URL:       e.amqpURL,
			Name:      benchName,
			Router:    r,
			Observers: []inboxtype.Observer{doneObserver{done: done}},
		})
		if err != nil {
			return nil, err
		}
		if err := c.Start(ctx); err != nil {
			return nil, err
		}
		return func() error {
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			return errors.Join(c.Stop(sctx), store.Stop(sctx))
		}, nil
	}
}
