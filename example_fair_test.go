package inboxmq_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
)

// Tenants share a fair route's slots: a bulk import of one tenant does not
// hold another tenant's payments back behind it, as one FIFO queue would.
// Producers publish to the route's exchange with the tenant as routing
// key; here one slot serves every tenant, and the vip tenant, which
// weighs 2, gets the slot whenever it frees while vip has jobs waiting.
func Example_fairShares() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, drop := exampleDB(ctx, "fair")
	defer drop()
	b := newExampleBroker("fair")
	defer b.Close()

	ran := make(chan string, 64)
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.Queue, func(ctx context.Context, _ pgx.Tx, msg *inboxtype.Message[Payment]) error {
		time.Sleep(20 * time.Millisecond) // the job's work
		ran <- msg.Body.OrderID
		return nil
	}, &inboxmq.RouteOpts{
		Concurrency: 1,
		// Each shard hands the worker up to 64 messages ahead: tenants
		// that hash to one shard are still told apart within them.
		Queue: &inboxmq.QueueOpts{Prefetch: 64},
		Fair:  &inboxmq.FairOpts{Weights: map[string]int{"vip": 2}},
	})
	w, err := inboxmq.NewWorker(&inboxmq.Config{URL: b.URL, DB: pool, Routes: routes})
	if err != nil {
		panic(err)
	}
	if err := w.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = w.Stop(context.Background()) }()

	publish := func(tenant, order string) {
		b.Publish(ctx, b.Queue, tenant, amqp.Publishing{
			ContentType: "application/json", Body: fmt.Appendf(nil, `{"order_id":%q,"cents":500}`, order),
		})
	}
	for i := range 50 {
		publish("bulk", fmt.Sprintf("bulk-%d", i))
	}
	next := func() string {
		select {
		case id := <-ran:
			return id
		case <-ctx.Done():
			return "timed out"
		}
	}
	for range 5 { // the import is under way
		next()
	}
	for i := range 3 {
		publish("vip", fmt.Sprintf("vip-%d", i))
	}
	bulk, vip := 0, 0
	for vip < 3 {
		if id := next(); id[:3] == "vip" {
			vip++
		} else {
			bulk++
		}
	}
	fmt.Println("vip's 3 payments ran before the import's other 45:", bulk < 10)
	// Output:
	// vip's 3 payments ran before the import's other 45: true
}
