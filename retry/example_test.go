package retry_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/inboxmq/inboxmq/retry"
)

// A handler signals what should happen through the error it returns.
func ExampleClassify() {
	errGateway := errors.New("gateway said 503")
	for _, err := range []error{
		nil,
		retry.ErrDuplicate,
		retry.Permanent(errors.New("amount must be positive")),
		retry.WithReason("gateway_5xx", retry.After(5*time.Second, errGateway)),
		errors.New("connection reset"),
	} {
		d := retry.Classify(err)
		fmt.Println(d.Kind, d.Reason, d.Delay)
	}
	// Output:
	// succeeded  0s
	// duplicate duplicate 0s
	// permanent permanent 0s
	// retry gateway_5xx 5s
	// retry error 0s
}

// Exponential spaces broker-side retries and bounds them.
func ExampleExponential() {
	p := retry.Exponential{InitialInterval: time.Second, RandomizationFactor: -1, MaxAttempts: 4}
	for attempt := 1; ; attempt++ {
		d, ok := p.NextDelay(attempt, nil)
		if !ok {
			fmt.Println("attempt", attempt, "-> dead-letter")
			break
		}
		fmt.Println("attempt", attempt, "-> retry in", d)
	}
	// Output:
	// attempt 1 -> retry in 1s
	// attempt 2 -> retry in 2s
	// attempt 3 -> retry in 4s
	// attempt 4 -> dead-letter
}
