package metrics_test

import (
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/metrics"
	"github.com/inboxmq/inboxmq/retry"
)

// Example builds the series on a registry, pre-initialises one route and
// feeds it the events the consumer reports for a delivery that turned out
// to be a duplicate caught by the completed-cache.
func Example() {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, nil) // nil Config: namespace "inboxmq"
	if err != nil {
		panic(err)
	}
	m.Init("payments", "payments") // every series exists at zero

	d := inboxtype.NewDelivery("payments", "payments", "worker-1", &amqp.Delivery{Redelivered: true})
	m.OnTransition(d, inboxtype.StatusReceived, nil)
	m.OnOutcome(d, inboxtype.Outcome{
		Decision: retry.Classify(retry.Duplicate(retry.SourceCache, nil)),
		Action:   inboxtype.ActionAcked,
		Duration: 2 * time.Millisecond,
	})

	err = testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP inboxmq_duplicate_detected_total Duplicate deliveries acked without a second effect, by where they were caught.
# TYPE inboxmq_duplicate_detected_total counter
inboxmq_duplicate_detected_total{consumer="payments",queue="payments",source="business_constraint"} 0
inboxmq_duplicate_detected_total{consumer="payments",queue="payments",source="cache"} 1
inboxmq_duplicate_detected_total{consumer="payments",queue="payments",source="claim_held"} 0
inboxmq_duplicate_detected_total{consumer="payments",queue="payments",source="fenced"} 0
inboxmq_duplicate_detected_total{consumer="payments",queue="payments",source="inbox"} 0
`), "inboxmq_duplicate_detected_total")
	fmt.Println("duplicates match:", err == nil)
	n, _ := testutil.GatherAndCount(reg, "inboxmq_redelivered_total", "inboxmq_in_flight")
	fmt.Println(n, "series")
	// Output:
	// duplicates match: true
	// 2 series
}
