package consumer

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/clip"
	"github.com/inboxmq/inboxmq/internal/logtest"
	"github.com/inboxmq/inboxmq/retry"
)

// TestCall_LastGuard: the consumer's last guard is the one recover on a
// delivery's path. A panic becomes an error with reason panic (retried
// under the policy, then dead-lettered); an error value stays in its
// chain; the stack is logged once (no logger stacktrace besides it), with
// the delivery's fields and the value cut to clip.Limit.
func TestCall_LastGuard(t *testing.T) {
	t.Parallel()
	huge := "bad amount " + strings.Repeat("9", 1<<20)
	tests := map[string]struct {
		handler  inboxtype.DeliveryHandler
		wantErr  string
		wantIs   error
		wantLogs int
		value    string
	}{
		"string panic": {
			handler:  func(context.Context, *inboxtype.Delivery) error { panic("nil map write") },
			wantErr:  "consumer: handler panicked: nil map write",
			wantLogs: 1,
			value:    "nil map write",
		},
		"error panic unwraps": {
			handler:  func(context.Context, *inboxtype.Delivery) error { panic(io.ErrUnexpectedEOF) },
			wantErr:  "consumer: handler panicked: unexpected EOF",
			wantIs:   io.ErrUnexpectedEOF,
			wantLogs: 1,
			value:    "unexpected EOF",
		},
		"huge value is clipped in the log": {
			handler:  func(context.Context, *inboxtype.Delivery) error { panic(errors.New(huge)) },
			wantLogs: 1,
			value:    clip.Text(huge, clip.Limit),
		},
		"no panic passes through": {
			handler: func(context.Context, *inboxtype.Delivery) error { return io.EOF },
			wantIs:  io.EOF,
		},
		"success": {
			handler: func(context.Context, *inboxtype.Delivery) error { return nil },
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			logger, logs := logtest.New(slog.LevelError)
			c := &Consumer{log: logger}
			d := &inboxtype.Delivery{Queue: "q", Namespace: "payments", MessageID: "m-1", Key: "order:1"}
			err := c.call(t.Context(), tc.handler, d, new(time.Duration))
			if tc.wantErr != "" {
				require.EqualError(t, err, tc.wantErr)
			}
			if tc.wantIs != nil {
				require.ErrorIs(t, err, tc.wantIs)
			}
			require.Len(t, logs.All(), tc.wantLogs)
			if tc.wantLogs == 0 {
				if tc.wantIs == nil {
					require.NoError(t, err)
				}
				return
			}
			dec := retry.Classify(err)
			require.Equal(t, retry.KindRetry, dec.Kind, "retried under the policy, then dead-lettered")
			require.Equal(t, retry.ReasonPanic, dec.Reason)
			entry := logs.All()[0]
			require.Equal(t, []string{"stack"}, entry.StackKeys(), "no stack besides the panic's own")
			fields := entry.Attrs
			require.Contains(t, fields["stack"], "panic_guard_internal_test.go", "the stack points at the panic")
			require.Equal(t, tc.value, fields["panic"])
			require.LessOrEqual(t, len(tc.value), clip.Limit)
			require.Equal(t, "q", fields["queue"])
			require.Equal(t, "payments", fields["namespace"])
			require.Equal(t, "m-1", fields["message_id"])
			require.Equal(t, "order:1", fields["idempotency_key"])
		})
	}
}
