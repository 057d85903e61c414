package inboxmq_test

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/migrations"
)

// The examples' set-up: each runs against the local services in a
// PostgreSQL schema and under RabbitMQ names of its own, removed at the end.

// exampleDB returns a pool on a new schema named after name, with the
// inbox's tables (package migrations) and ddl applied; drop removes the
// schema and closes the pool.
func exampleDB(ctx context.Context, name string, ddl ...string) (pool *pgxpool.Pool, drop func()) {
	cfg, err := pgxpool.ParseConfig(cmp.Or(os.Getenv("TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"))
	if err != nil {
		panic(err)
	}
	schema := fmt.Sprintf("example_%s_%d", name, time.Now().UnixNano())
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	if err := inbox.ConfigurePool(cfg); err != nil {
		panic(err)
	}
	if pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		panic(err)
	}
	drop = func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		pool.Close()
	}
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		drop()
		panic(err)
	}
	if err := migrations.Up(ctx, pool); err != nil {
		drop()
		panic(err)
	}
	for _, sql := range ddl {
		if _, err := pool.Exec(ctx, sql); err != nil {
			drop()
			panic(err)
		}
	}
	return pool, drop
}

// reportTo is a route middleware that sends what each delivery's handling
// returned (the inbox's answer included) to settled.
func reportTo(settled chan<- error) inboxtype.Middleware {
	return func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
		return func(ctx context.Context, d *inboxtype.Delivery) error {
			err := next(ctx, d)
			settled <- err
			return err
		}
	}
}

// exampleBroker is an example's connection to RabbitMQ and the name of its
// work queue.
type exampleBroker struct {
	URL   string
	Queue string
	conn  *amqp.Connection
	ch    *amqp.Channel
}

// newExampleBroker connects and picks a queue name after name.
func newExampleBroker(name string) *exampleBroker {
	b := &exampleBroker{
		URL:   cmp.Or(os.Getenv("TEST_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/"),
		Queue: fmt.Sprintf("example.%s.%d", name, time.Now().UnixNano()),
	}
	var err error
	if b.conn, err = amqp.Dial(b.URL); err != nil {
		panic(err)
	}
	if b.ch, err = b.conn.Channel(); err != nil {
		panic(err)
	}
	if err := b.ch.Confirm(false); err != nil {
		panic(err)
	}
	return b
}

// Publish publishes msg and waits for the broker's confirm.
func (b *exampleBroker) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) {
	dc, err := b.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, msg)
	if err != nil {
		panic(err)
	}
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		panic(fmt.Sprintf("publish not confirmed: %v", err))
	}
}

// Subscribe declares a private queue, bound to exchange for key unless
// exchange is "", and returns its name and deliveries.
func (b *exampleBroker) Subscribe(ctx context.Context, exchange, key string) (string, <-chan amqp.Delivery) {
	q, err := b.ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		panic(err)
	}
	if exchange != "" {
		if err := b.ch.QueueBind(q.Name, key, exchange, false, nil); err != nil {
			panic(err)
		}
	}
	deliveries, err := b.ch.ConsumeWithContext(ctx, q.Name, "", true, true, false, false, nil)
	if err != nil {
		panic(err)
	}
	return q.Name, deliveries
}

// Close deletes the work queue's topology (its DLQ, dead, parked, retry
// and shard queues, its ordered exchange) and the exchanges named, then
// disconnects. Deleting a name that does not exist is harmless.
func (b *exampleBroker) Close(exchanges ...string) {
	defer b.conn.Close()
	queues := []string{b.Queue, inboxtype.DeadLetterQueue(b.Queue), b.Queue + ".dead", inboxtype.ParkedQueue(b.Queue), b.Queue + ".members"}
	for _, tier := range consumer.DefaultRetryTiers {
		queues = append(queues, inboxtype.RetryQueue(b.Queue, tier))
	}
	for i := range 8 {
		queues = append(queues, consumer.ShardQueueName(b.Queue, i))
	}
	ch, err := b.conn.Channel() // a failed delete closes a channel: take a new one
	for _, q := range queues {
		if err == nil {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
		if err != nil || ch.IsClosed() {
			ch, err = b.conn.Channel()
		}
	}
	for _, e := range append(exchanges, b.Queue) {
		if err == nil {
			_ = ch.ExchangeDelete(e, false, false)
		}
		if err != nil || ch.IsClosed() {
			ch, err = b.conn.Channel()
		}
	}
}
