package inboxmq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// A downstream answers 429 with Retry-After for one tenant: the handler
// returns retry.After with that delay, and the worker defers the tenant's
// other payments until it has passed — without running them and without
// spending their attempts — while another tenant's payments run at once.
// RouteOpts.Tenant names a delivery's tenant, here from a header.
func Example_tenantDeferral() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, drop := exampleDB(ctx, "tenant")
	defer drop()
	b := newExampleBroker("tenant")
	defer b.Close()

	ran := make(chan string, 8)
	var limited atomic.Bool
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.Queue, func(_ context.Context, _ pgx.Tx, msg *inboxtype.Message[Payment]) error {
		ran <- msg.Body.OrderID
		if msg.Body.OrderID == "acme-1" && limited.CompareAndSwap(false, true) {
			// The downstream: 429, Retry-After: 1.
			return retry.After(time.Second, errors.New("HTTP 429 Too Many Requests"))
		}
		return nil
	}, &inboxmq.RouteOpts{
		Concurrency: 1,
		Tenant: func(d *inboxtype.Delivery) string {
			tenant, _ := d.Raw.Headers["tenant"].(string)
			return tenant
		},
	})
	w, err := inboxmq.NewWorker(&inboxmq.Config{URL: b.URL, DB: pool, Routes: routes})
	if err != nil {
		panic(err)
	}
	if err := w.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = w.Stop(context.Background()) }()

	for _, p := range [][2]string{{"acme-1", "acme"}, {"acme-2", "acme"}, {"globex-1", "globex"}} {
		b.Publish(ctx, "", b.Queue, amqp.Publishing{
			ContentType: "application/json", Headers: amqp.Table{"tenant": p[1]},
			Body: fmt.Appendf(nil, `{"order_id":%q,"cents":500}`, p[0]),
		})
	}
	next := func() string {
		select {
		case id := <-ran:
			return id
		case <-ctx.Done():
			return "timed out"
		}
	}
	fmt.Println("429 for:", next())
	fmt.Println("meanwhile:", next())
	later := []string{next(), next()}
	slices.Sort(later)
	fmt.Println("once acme's delay passed:", later)
	// Output:
	// 429 for: acme-1
	// meanwhile: globex-1
	// once acme's delay passed: [acme-1 acme-2]
}
