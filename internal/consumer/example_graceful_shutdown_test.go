package consumer_test

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
)

// Report is a slow job: building a monthly report.
type Report struct {
	Month string `json:"month"`
}

// IdempotencyKey implements inboxtype.Keyer.
func (r Report) IdempotencyKey() string { return "report:" + r.Month }

// Stop stops consuming, lets in-flight handlers finish and settle, and only
// then closes the connection. A real program calls it when its signal
// context ends:
//
//	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
//	defer stop()
//	if err := c.Start(ctx); err != nil { … }
//	<-ctx.Done()
//	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
//	defer cancel()
//	_ = c.Stop(stopCtx)
//
// After Config.SoftStopTimeout, handler contexts are cancelled with cause
// consumer.ErrStopped and their deliveries are requeued for another worker.
func Example_gracefulShutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	amqpURL := cmp.Or(os.Getenv("TEST_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")
	queue := fmt.Sprintf("example.shutdown.%d", time.Now().UnixNano())

	// A connection to publish with, and to delete the queue, its DLQ and
	// its delay queues at the end (after the consumer stopped).
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
		_, _ = ch.QueueDelete(queue, false, false, false)
		_, _ = ch.QueueDelete(queue+".dlq", false, false, false)
		for _, tier := range consumer.DefaultRetryTiers {
			_, _ = ch.QueueDelete(inboxtype.RetryQueue(queue, tier), false, false, false)
		}
	}()

	started, finish := make(chan struct{}), make(chan struct{})
	r := consumer.NewRouter()
	consumer.Register(r, queue, inboxtype.HandlerFunc[Report](func(context.Context, *inboxtype.Message[Report]) error {
		fmt.Println("handler started")
		close(started)
		<-finish // still working when Stop is called
		fmt.Println("handler finished")
		return nil
	}), nil)
	c, err := consumer.New(&consumer.Config{URL: amqpURL, Router: r, SoftStopTimeout: 20 * time.Second})
	if err != nil {
		panic(err)
	}
	if err := c.Start(ctx); err != nil {
		panic(err)
	}

	// Publish one message with a publisher confirm.
	if err := ch.Confirm(false); err != nil {
		panic(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
		ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(`{"month":"2026-03"}`),
	})
	if err != nil {
		panic(err)
	}
	if _, err := dc.WaitContext(ctx); err != nil {
		panic(err)
	}
	select {
	case <-started:
	case <-ctx.Done():
		fmt.Println("timed out")
		return
	}

	stopped := make(chan error, 1)
	go func() { stopped <- c.Stop(ctx) }()
	fmt.Println("stopping")
	close(finish)
	select {
	case err := <-stopped:
		fmt.Println("stopped:", err, "ready:", c.Ready())
	case <-ctx.Done():
		fmt.Println("timed out")
	}
	// Output:
	// handler started
	// stopping
	// handler finished
	// stopped: <nil> ready: false
}
