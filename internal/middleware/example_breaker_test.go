package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/middleware"
	"github.com/inboxmq/inboxmq/retry"
)

// printRestricter stands in for the consumer (*consumer.Consumer).
type printRestricter struct{}

func (printRestricter) Restrict(queue, reason string, n int) error {
	fmt.Printf("restrict %s (%s) to %d\n", queue, reason, n)
	return nil
}

func (printRestricter) Unrestrict(queue, reason string) error {
	fmt.Printf("unrestrict %s (%s)\n", queue, reason)
	return nil
}

// A gateway that keeps failing trips the breaker: the queue is paused, and
// a delivery that still arrives is deferred without counting an attempt.
func ExampleBreaker() {
	b, err := middleware.NewBreaker(&middleware.BreakerOpts{
		Downstream: "gateway", MinCalls: 3, Threshold: 0.5, CoolDown: time.Minute,
		Target: printRestricter{},
	})
	if err != nil {
		panic(err)
	}
	defer b.Close()
	charge := b.Guard("payments")(func(context.Context, *inboxtype.Delivery) error {
		return errors.New("gateway: 503 Service Unavailable") // a retryable failure
	})
	for range 3 {
		_ = charge(context.Background(), &inboxtype.Delivery{Queue: "payments"})
	}
	fmt.Println("state:", b.State())
	dec := retry.Classify(charge(context.Background(), &inboxtype.Delivery{Queue: "payments"}))
	fmt.Println("held back:", dec.Reason, "counted as an attempt:", !dec.Uncounted)
	// Output:
	// restrict payments (breaker) to 0
	// state: open
	// held back: breaker_open counted as an attempt: false
}
