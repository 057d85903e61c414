package inboxtype_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
)

// The queue names are wire format: ops scripts, alerts and the broker's
// existing queues depend on them, so they are pinned literally here.
func TestQueueNames(t *testing.T) {
	t.Parallel()
	require.Equal(t, "payments.dlq", inboxtype.DeadLetterQueue("payments"))
	require.Equal(t, "payments.parked", inboxtype.ParkedQueue("payments"))
	require.Equal(t, "payments.retry.5s", inboxtype.RetryQueue("payments", 5*time.Second))
	require.Equal(t, "payments.retry.1m0s", inboxtype.RetryQueue("payments", time.Minute))
	require.Equal(t, "payments.retry.100ms", inboxtype.RetryQueue("payments", 100*time.Millisecond))
}
