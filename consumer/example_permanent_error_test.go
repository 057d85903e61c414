package consumer_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// actionObserver reports each delivery's final action.
type actionObserver struct {
	inboxtype.NopObserver
	actions chan inboxtype.Action
}

func (o actionObserver) OnOutcome(_ *inboxtype.Delivery, out inboxtype.Outcome) {
	o.actions <- out.Action
}

// A permanent error dead-letters the message at once: a confirmed copy goes
// to "<queue>.dlq" with the reason in x-error, then the original is acked.
func Example_permanentError() {
	queue, cleanup := exampleQueue("charges")
	defer cleanup()
	ctx := context.Background()

	r := consumer.NewRouter()
	consumer.Register(r, queue, inboxtype.HandlerFunc[Payment](func(context.Context, *inboxtype.Message[Payment]) error {
		return retry.Permanent(errors.New("card declined")) // no retry can fix this
	}), nil)
	obs := actionObserver{actions: make(chan inboxtype.Action, 1)}
	c, err := consumer.New(&consumer.Config{URL: testenv.AMQPURL(), Router: r, Observers: []inboxtype.Observer{obs}})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := c.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = c.Stop(ctx) }()
	if err := examplePublish(queue, `{"order_id":"B-7","cents":500}`); err != nil {
		fmt.Println(err)
	}
	action, _ := wait(obs.actions)
	fmt.Println("action:", action)

	dead, ok := exampleGet(queue + ".dlq")
	fmt.Println("in DLQ:", ok)
	fmt.Println("x-error:", dead.Headers[inboxtype.HeaderError])
	fmt.Println("x-idempotency-key:", dead.Headers[inboxtype.HeaderIdempotencyKey])
	fmt.Println("body:", string(dead.Body))
	// Output:
	// action: dead_lettered
	// in DLQ: true
	// x-error: permanent: card declined
	// x-idempotency-key: payment:B-7
	// body: {"order_id":"B-7","cents":500}
}
