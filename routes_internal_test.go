package inboxmq

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/internal/consumer"
)

// A route's queue settings: quorum by default, and with group commit and
// no concurrency, enough handlers to fill every batch in flight.
func TestRouteQueueOpts(t *testing.T) {
	t.Parallel()
	tiers := consumer.DefaultRetryTiers
	for _, tt := range []struct {
		name string
		opts RouteOpts
		want consumer.QueueOpts
	}{
		{name: "defaults: quorum, a delivery limit of 20, the default tiers", opts: RouteOpts{},
			want: consumer.QueueOpts{Type: consumer.Quorum, DeliveryLimit: 20, RetryTiers: tiers}},
		{name: "classic queues have no delivery limit", opts: RouteOpts{Queue: &QueueOpts{Type: Classic}},
			want: consumer.QueueOpts{Type: consumer.Classic, RetryTiers: tiers}},
		{name: "group commit at the defaults fills two batches of 256", opts: RouteOpts{GroupCommit: &inbox.GroupCommit{}},
			want: consumer.QueueOpts{Type: consumer.Quorum, DeliveryLimit: 20, RetryTiers: tiers, Concurrency: 512, Prefetch: 1024}},
		{name: "the route's batch settings", opts: RouteOpts{GroupCommit: &inbox.GroupCommit{MaxBatch: 32, MaxInFlight: 4}},
			want: consumer.QueueOpts{Type: consumer.Quorum, DeliveryLimit: 20, RetryTiers: tiers, Concurrency: 128, Prefetch: 256}},
		{name: "an explicit concurrency wins", opts: RouteOpts{GroupCommit: &inbox.GroupCommit{}, Concurrency: 8},
			want: consumer.QueueOpts{Type: consumer.Quorum, DeliveryLimit: 20, RetryTiers: tiers, Concurrency: 8}},
		{name: "an explicit prefetch is kept", opts: RouteOpts{GroupCommit: &inbox.GroupCommit{}, Queue: &QueueOpts{Prefetch: 500}},
			want: consumer.QueueOpts{Type: consumer.Quorum, DeliveryLimit: 20, RetryTiers: tiers, Concurrency: 512, Prefetch: 500}},
		{name: "the queue's own settings", opts: RouteOpts{Queue: &QueueOpts{DeliveryLimit: 5, RetryTiers: []time.Duration{time.Second}, DeadLetterQueue: "dead"}},
			want: consumer.QueueOpts{Type: consumer.Quorum, DeliveryLimit: 5, RetryTiers: []time.Duration{time.Second}, DeadLetterQueue: "dead"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rt := &route{queue: "q", opts: tt.opts}
			require.Equal(t, tt.want, rt.queueOpts())
		})
	}
}
