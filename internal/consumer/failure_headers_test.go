package consumer

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
)

func TestFailureHeaders_FirstFailedAtIsTrustedOnlyFromOwnCopies(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	nowText := now.Format(time.RFC3339Nano)
	past := now.Add(-time.Hour).Format(time.RFC3339)
	for _, tc := range []struct {
		name    string
		headers amqp.Table
		want    string
	}{
		{"none", amqp.Table{}, nowText},
		{"own copy", amqp.Table{inboxtype.HeaderOriginalQueue: "q", inboxtype.HeaderFirstFailedAt: past}, past},
		{"own copy, clock a little ahead", amqp.Table{inboxtype.HeaderOriginalQueue: "q", inboxtype.HeaderFirstFailedAt: now.Add(30 * time.Second).Format(time.RFC3339)}, now.Add(30 * time.Second).Format(time.RFC3339)},
		{"producer-set", amqp.Table{inboxtype.HeaderFirstFailedAt: past}, nowText},
		{"another queue's copy", amqp.Table{inboxtype.HeaderOriginalQueue: "other", inboxtype.HeaderFirstFailedAt: past}, nowText},
		{"future", amqp.Table{inboxtype.HeaderOriginalQueue: "q", inboxtype.HeaderFirstFailedAt: now.Add(time.Hour).Format(time.RFC3339)}, nowText},
		{"not a time", amqp.Table{inboxtype.HeaderOriginalQueue: "q", inboxtype.HeaderFirstFailedAt: "yesterday"}, nowText},
		{"not a string", amqp.Table{inboxtype.HeaderOriginalQueue: "q", inboxtype.HeaderFirstFailedAt: now.Add(-time.Hour)}, nowText},
		{"original queue not a string", amqp.Table{inboxtype.HeaderOriginalQueue: []byte("q"), inboxtype.HeaderFirstFailedAt: past}, nowText},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out := cloneTable(tc.headers)
			setFailureHeaders(out, nil, "q", "permanent", nil, now)
			require.Equal(t, tc.want, out[inboxtype.HeaderFirstFailedAt])
			require.Equal(t, nowText, out[inboxtype.HeaderLastFailedAt])
			require.Equal(t, "q", out[inboxtype.HeaderOriginalQueue])
		})
	}
}
