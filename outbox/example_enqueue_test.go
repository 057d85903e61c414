package outbox_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/outbox"
)

// Example_enqueue writes a message in the business transaction and lets a
// relay publish it after the commit.
func Example_enqueue() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, conn, queue, cleanup, err := exampleEnv(ctx)
	if err != nil {
		fmt.Println("setup:", err)
		return
	}
	defer cleanup()

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
		fmt.Println("enqueue:", err)
		return
	}

	// In the worker: the relay publishes with confirms, then marks sent.
	relay, err := outbox.NewRelay(pool, &outbox.RelayConfig{
		URL:        testenv.AMQPURL(),
		Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		fmt.Println("relay:", err)
		return
	}
	if err := relay.Start(ctx); err != nil {
		fmt.Println("start:", err)
		return
	}
	defer func() { _ = relay.Stop(ctx) }()

	ch, err := conn.Channel()
	if err != nil {
		fmt.Println("channel:", err)
		return
	}
	deliveries, err := ch.ConsumeWithContext(ctx, queue, "", true, false, false, false, nil)
	if err != nil {
		fmt.Println("consume:", err)
		return
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
