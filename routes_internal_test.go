package inboxmq

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/inbox"
)

func TestRouteQueueOptsGroupCommitConcurrency(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		opts  RouteOpts
		store *inbox.StoreConfig
		want  consumer.QueueOpts
	}{
		{name: "no group commit keeps the queue settings", opts: RouteOpts{Queue: consumer.QueueOpts{Type: consumer.Quorum}},
			want: consumer.QueueOpts{Type: consumer.Quorum}},
		{name: "group commit at the defaults fills two batches of 64", opts: RouteOpts{GroupCommit: &inbox.GroupCommit{}},
			want: consumer.QueueOpts{Concurrency: 128, Prefetch: 256}},
		{name: "the route's batch settings", opts: RouteOpts{GroupCommit: &inbox.GroupCommit{MaxBatch: 32, MaxInFlight: 4}},
			want: consumer.QueueOpts{Concurrency: 128, Prefetch: 256}},
		{name: "the store's defaults", opts: RouteOpts{GroupCommit: &inbox.GroupCommit{MaxBatch: 16}},
			store: &inbox.StoreConfig{GroupCommit: inbox.GroupCommit{MaxBatch: 100, MaxInFlight: 3}},
			want:  consumer.QueueOpts{Concurrency: 48, Prefetch: 96}},
		{name: "an explicit concurrency wins", opts: RouteOpts{GroupCommit: &inbox.GroupCommit{}, Queue: consumer.QueueOpts{Concurrency: 8}},
			want: consumer.QueueOpts{Concurrency: 8}},
		{name: "a pipelined route fills two batches of 256", opts: RouteOpts{GroupCommit: &inbox.GroupCommit{Pipeline: true}},
			want: consumer.QueueOpts{Concurrency: 512, Prefetch: 1024}},
		{name: "the store's batch size wins over the pipelined default", opts: RouteOpts{GroupCommit: &inbox.GroupCommit{Pipeline: true}},
			store: &inbox.StoreConfig{GroupCommit: inbox.GroupCommit{MaxBatch: 64}},
			want:  consumer.QueueOpts{Concurrency: 128, Prefetch: 256}},
		{name: "an explicit prefetch is kept", opts: RouteOpts{GroupCommit: &inbox.GroupCommit{}, Queue: consumer.QueueOpts{Prefetch: 500}},
			want: consumer.QueueOpts{Concurrency: 128, Prefetch: 500}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rt := &route{queue: "q", opts: tt.opts}
			require.Equal(t, tt.want, rt.queueOpts(tt.store))
		})
	}
}

// The handler gets the batch settings the route's concurrency was sized
// for: the same MaxBatch and MaxInFlight, the route's other fields kept.
func TestRouteGroupCommitResolved(t *testing.T) {
	t.Parallel()
	rt := &route{queue: "q", opts: RouteOpts{GroupCommit: &inbox.GroupCommit{Pipeline: true, MaxWait: time.Millisecond}}}
	require.Equal(t, &inbox.GroupCommit{Pipeline: true, MaxWait: time.Millisecond, MaxBatch: 256, MaxInFlight: 2}, rt.groupCommit(nil))
	require.Equal(t, &inbox.GroupCommit{MaxBatch: 64, MaxInFlight: 3},
		(&route{queue: "q", opts: RouteOpts{GroupCommit: &inbox.GroupCommit{}}}).groupCommit(&inbox.StoreConfig{GroupCommit: inbox.GroupCommit{MaxInFlight: 3}}))
	require.Nil(t, (&route{queue: "q"}).groupCommit(nil))
	q := rt.queueOpts(nil)
	gc := rt.groupCommit(nil)
	require.Equal(t, gc.MaxBatch*gc.MaxInFlight, q.Concurrency, "the concurrency fills the handler's batches")
}
