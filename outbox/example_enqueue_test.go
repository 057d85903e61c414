package outbox_test

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/migrations"
	"github.com/inboxmq/inboxmq/outbox"
	"github.com/inboxmq/inboxmq/producer"
)

// Capture is a job: capture the payment of an order.
type Capture struct {
	OrderID string `json:"order_id"`
}

// IdempotencyKey implements inboxtype.Keyer.
func (c Capture) IdempotencyKey() string { return "capture:" + c.OrderID }

// Example_enqueue writes an event in the handler's transaction, with the
// business write; the worker's relay publishes it once that transaction
// has committed.
func Example_enqueue() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// PostgreSQL: a schema of this example's own, with the inbox and
	// outbox tables (package migrations) and a captures table.
	cfg, err := pgxpool.ParseConfig(cmp.Or(os.Getenv("TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"))
	if err != nil {
		panic(err)
	}
	schema := fmt.Sprintf("example_outbox_%d", time.Now().UnixNano())
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	if err := inbox.ConfigurePool(cfg); err != nil {
		panic(err)
	}
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
	if _, err := pool.Exec(ctx, `CREATE TABLE captures (order_id text PRIMARY KEY)`); err != nil {
		panic(err)
	}

	// RabbitMQ: the route's queue (the worker declares it, with its DLQ
	// and delay queues) and a queue for the events, deleted at the end.
	amqpURL := cmp.Or(os.Getenv("TEST_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")
	queue := fmt.Sprintf("example.captures.%d", time.Now().UnixNano())
	events := queue + ".events"
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	defer func() {
		queues := []string{queue, inboxtype.DeadLetterQueue(queue), events}
		for _, tier := range consumer.DefaultRetryTiers {
			queues = append(queues, inboxtype.RetryQueue(queue, tier))
		}
		for _, q := range queues {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
	}()
	if _, err := ch.QueueDeclare(events, true, false, false, false, nil); err != nil {
		panic(err)
	}

	// The handler: the business write and the outgoing event commit
	// together, or neither does.
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[Capture]) error {
		if _, err := tx.Exec(ctx, `INSERT INTO captures (order_id) VALUES ($1)`, msg.Body.OrderID); err != nil {
			return err
		}
		return outbox.Enqueue(ctx, tx, outbox.Message{
			RoutingKey:     events,                      // the default exchange: the routing key names the queue
			IdempotencyKey: msg.Key + "/captured",       // the message id derives from it
			OrderingKey:    "order:" + msg.Body.OrderID, // this order's events go out in enqueue order
			ContentType:    "application/json",
			Body:           []byte(`{"order_id":"` + msg.Body.OrderID + `","status":"captured"}`),
		})
	}, nil)

	// The worker runs the relay: it publishes committed rows with
	// publisher confirms and marks them sent.
	w, err := inboxmq.NewWorker(&inboxmq.Config{URL: amqpURL, DB: pool, Routes: routes})
	if err != nil {
		panic(err)
	}
	if err := w.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = w.Stop(context.Background()) }()

	p, err := producer.New(&producer.Config{URL: amqpURL})
	if err != nil {
		panic(err)
	}
	defer p.Close()
	if err := producer.Publish(ctx, p, "", queue, Capture{OrderID: "42"}, nil); err != nil {
		panic(err)
	}

	deliveries, err := ch.ConsumeWithContext(ctx, events, "", true, false, false, false, nil)
	if err != nil {
		panic(err)
	}
	select {
	case d := <-deliveries:
		fmt.Println("event:", string(d.Body))
		fmt.Println("idempotency key:", d.Headers[inboxtype.HeaderIdempotencyKey])
		fmt.Println("stable message id:", d.MessageId == outbox.DeriveID("", events, "capture:42/captured"))
	case <-ctx.Done():
		fmt.Println("timed out")
	}

	// Output:
	// event: {"order_id":"42","status":"captured"}
	// idempotency key: capture:42/captured
	// stable message id: true
}

// ExampleAddToBatch sends a handler's business writes and its outgoing
// message in one batch, on the transaction that should enqueue it.
func ExampleAddToBatch() {
	handler := func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[Capture]) error {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO captures (order_id) VALUES ($1)`, msg.Body.OrderID)
		if err := outbox.AddToBatch(ctx, b, outbox.Message{
			Exchange:       "payments.events",
			RoutingKey:     "payment.captured",
			IdempotencyKey: msg.Key + "/captured",
			ContentType:    "application/json",
			Body:           []byte(`{"order_id":"` + msg.Body.OrderID + `"}`),
		}); err != nil {
			return err
		}
		// One round trip: the insert and the outbox row (in a worker's
		// handler, no NOTIFY: the worker wakes its own relay).
		return tx.SendBatch(ctx, b).Close()
	}
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, "captures", handler, nil)
}
