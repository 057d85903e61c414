package inboxmq_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// A route with RouteOpts.Faults announces every message that reaches its
// dead-letter queue: a fault event (an inboxmq.FaultEvent as JSON) goes out
// through the outbox, once, when the message is dead-lettered, so another
// service can react to a declined payment without polling the DLQ.
func Example_faults() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, drop := exampleDB(ctx, "faults")
	defer drop()
	b := newExampleBroker("faults")
	events := b.Queue + ".events"
	defer b.Close(events)

	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.Queue, func(context.Context, pgx.Tx, *inboxtype.Message[Payment]) error {
		// Permanent: dead-lettered at once, with its reason.
		return retry.WithReason("declined", retry.Permanent(errors.New("card declined")))
	}, &inboxmq.RouteOpts{Faults: &inboxmq.FaultOpts{Exchange: events, RoutingKey: "payment.failed"}})
	w, err := inboxmq.NewWorker(&inboxmq.Config{URL: b.URL, DB: pool, Routes: routes, Exchanges: []string{events}})
	if err != nil {
		panic(err)
	}
	if err := w.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = w.Stop(context.Background()) }()
	_, faults := b.Subscribe(ctx, events, "payment.failed")

	b.Publish(ctx, "", b.Queue, amqp.Publishing{ContentType: "application/json", Body: []byte(`{"order_id":"42","cents":1999}`)})
	select {
	case d := <-faults:
		var ev inboxmq.FaultEvent
		if err := json.Unmarshal(d.Body, &ev); err != nil {
			panic(err)
		}
		fmt.Println("key:", ev.Key)
		fmt.Println("reason:", ev.Reason, "after attempt", ev.Attempts)
		fmt.Println("from the queue:", ev.Queue == b.Queue)
	case <-ctx.Done():
		fmt.Println("timed out")
	}
	// Output:
	// key: payment:42
	// reason: declined after attempt 1
	// from the queue: true
}
