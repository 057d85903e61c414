package outbox_test

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/migrations"
	"github.com/inboxmq/inboxmq/outbox"
)

// Example_enqueue writes a message in the business transaction and lets a
// relay publish it after the commit.
func Example_enqueue() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// PostgreSQL: a schema of this example's own, with the outbox table
	// (package migrations).
	cfg, err := pgxpool.ParseConfig(cmp.Or(os.Getenv("TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"))
	if err != nil {
		panic(err)
	}
	schema := fmt.Sprintf("example_outbox_%d", time.Now().UnixNano())
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		panic(err)
	}
	defer pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
	if err := migrations.Up(ctx, pool); err != nil {
		panic(err)
	}

	// RabbitMQ: a queue of this example's own, deleted at the end.
	amqpURL := cmp.Or(os.Getenv("TEST_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")
	queue := fmt.Sprintf("example.outbox.%d", time.Now().UnixNano())
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		panic(err)
	}
	defer ch.QueueDelete(queue, false, false, false)

	// In the handler: the business writes and the outgoing message commit
	// together, or neither does.
	msg := outbox.Message{
		RoutingKey:     queue, // default exchange: routing key = queue
		IdempotencyKey: "payment-42/captured",
		ContentType:    "application/json",
		Body:           []byte(`{"payment":42,"status":"captured"}`),
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// … business writes with tx …
		return outbox.Enqueue(ctx, tx, msg)
	})
	if err != nil {
		panic(err)
	}

	// In the worker: the relay publishes with confirms, then marks sent.
	relay, err := outbox.NewRelay(pool, &outbox.RelayConfig{
		URL:        amqpURL,
		Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		panic(err)
	}
	if err := relay.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = relay.Stop(context.Background()) }()

	deliveries, err := ch.ConsumeWithContext(ctx, queue, "", true, false, false, false, nil)
	if err != nil {
		panic(err)
	}
	select {
	case d := <-deliveries:
		fmt.Println("body:", string(d.Body))
		fmt.Println("idempotency key:", d.Headers[inboxtype.HeaderIdempotencyKey])
		fmt.Println("stable message id:", d.MessageId == outbox.DeriveID("", queue, "payment-42/captured"))
	case <-ctx.Done():
		fmt.Println("timed out")
	}

	// Output:
	// body: {"payment":42,"status":"captured"}
	// idempotency key: payment-42/captured
	// stable message id: true
}

// ExampleAddToBatch sends a handler's business writes and its outgoing
// message in one batch, on the transaction that should enqueue it.
func ExampleAddToBatch() {
	handler := func(ctx context.Context, tx pgx.Tx, orderID string, amount int64) error {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO payments (order_id, amount_cents) VALUES ($1, $2)`, orderID, amount)
		if err := outbox.AddToBatch(ctx, b, outbox.Message{
			Exchange:       "payments.events",
			RoutingKey:     "payment.completed",
			IdempotencyKey: "payment:" + orderID,
			ContentType:    "application/json",
			Body:           []byte(`{"order_id":"` + orderID + `"}`),
		}); err != nil {
			return err
		}
		// One round trip: the insert, the outbox row and the NOTIFY.
		return tx.SendBatch(ctx, b).Close()
	}
	_ = handler // a handler's body: transactional mode calls it with its tx
}
