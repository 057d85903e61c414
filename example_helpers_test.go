package inboxmq_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/migrations"
)

// Payment is the payload of the examples: its business identity is the
// order id.
type Payment struct {
	OrderID string `json:"order_id"`
	Cents   int    `json:"cents"`
}

// IdempotencyKey implements inboxtype.Keyer.
func (p Payment) IdempotencyKey() string { return "payment:" + p.OrderID }

// exampleDB opens a pool on a fresh schema with the migrations applied and
// a payments table, and returns it with a function dropping the schema.
func exampleDB(ctx context.Context, name string) (*pgxpool.Pool, func()) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "example_" + name + "_" + hex.EncodeToString(b[:])
	admin, err := pgxpool.New(ctx, testenv.DatabaseURL())
	if err != nil {
		panic(err)
	}
	drop := func() {
		_, _ = admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		panic(err)
	}
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL())
	if err != nil {
		panic(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	if err := migrations.Up(ctx, pool); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (order_id text PRIMARY KEY, cents int NOT NULL)`); err != nil {
		panic(err)
	}
	return pool, func() { pool.Close(); drop(); admin.Close() }
}

// exampleQueue returns a unique queue name and a function that deletes the
// queue, its DLQ and its delay tiers.
func exampleQueue(name string) (string, func()) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	q := "example." + name + "." + hex.EncodeToString(b[:])
	return q, func() {
		conn, err := amqp.Dial(testenv.AMQPURL())
		if err != nil {
			return
		}
		defer conn.Close()
		names := []string{q, q + ".dlq"}
		for _, tier := range consumer.DefaultRetryTiers {
			names = append(names, consumer.RetryQueueName(q, tier))
		}
		for _, n := range names {
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(n, false, false, false)
				_ = ch.Close()
			}
		}
	}
}

// examplePublish publishes body to queue with a publisher confirm.
func examplePublish(queue, body string) error {
	conn, err := amqp.Dial(testenv.AMQPURL())
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
		ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(body),
	})
	if err != nil {
		return err
	}
	_, err = dc.WaitContext(ctx)
	return err
}

// wait waits for ch or gives up after 30s.
func wait[T any](ch <-chan T) (T, bool) {
	select {
	case v := <-ch:
		return v, true
	case <-time.After(30 * time.Second):
		var zero T
		return zero, false
	}
}
