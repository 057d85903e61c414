package consumer_test

import (
	"context"
	"fmt"
	"time"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

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
	queue, cleanup := exampleQueue("shutdown")
	defer cleanup()

	started, finish := make(chan struct{}), make(chan struct{})
	r := consumer.NewRouter()
	consumer.Register(r, queue, inboxtype.HandlerFunc[Payment](func(context.Context, *inboxtype.Message[Payment]) error {
		fmt.Println("handler started")
		close(started)
		<-finish // still working when Stop is called
		fmt.Println("handler finished")
		return nil
	}), nil)
	c, err := consumer.New(&consumer.Config{URL: testenv.AMQPURL(), Router: r, SoftStopTimeout: 20 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := c.Start(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	if err := examplePublish(queue, `{"order_id":"C-3","cents":100}`); err != nil {
		fmt.Println(err)
	}
	wait(started)

	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- c.Stop(stopCtx) }()
	fmt.Println("stopping")
	close(finish)
	err, _ = wait(stopped)
	fmt.Println("stopped:", err, "ready:", c.Ready())
	// Output:
	// handler started
	// stopping
	// handler finished
	// stopped: <nil> ready: false
}
