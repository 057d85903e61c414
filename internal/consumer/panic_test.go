package consumer_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/logtest"
	"github.com/inboxmq/inboxmq/retry"
)

// A message whose handler panics every time, with no Recover middleware:
// the consumer's last guard turns each panic into a retry, the retries are
// bounded and the message ends in the DLQ; each panic's stack is logged
// once, by the guard.
func TestConsumer_PanicEveryTimeEndsInDLQWithOneStackPerPanic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	logger, logs := logtest.New(slog.LevelError)
	r := consumer.NewRouter()
	opts := fastOpts(100 * time.Millisecond)
	opts.Policy = retry.Exponential{InitialInterval: 10 * time.Millisecond, MaxAttempts: 2}
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error {
		panic("nil map write")
	}), opts)
	c := b.start(t, r, func(cfg *consumer.Config) {
		cfg.Logger = logger
	})
	b.publish(t, b.queue, `{"id":"boom"}`)

	o := b.rec.next(t)
	require.Equal(t, inboxtype.ActionRetried, o.Outcome.Action)
	require.Equal(t, retry.ReasonPanic, o.Outcome.Decision.Reason)
	o = b.rec.next(t)
	require.Equal(t, inboxtype.ActionDeadLettered, o.Outcome.Action)
	b.stop(t, c)

	dead := amqptest.Drain(t, b.conn, b.queue+".dlq")
	require.Len(t, dead, 1)
	require.Equal(t, "exhausted: after 2 failed attempts: consumer: handler panicked: nil map write", dead[0].Headers[inboxtype.HeaderError])
	require.Equal(t, 2, inboxtype.HeaderInt(dead[0].Headers, inboxtype.HeaderAttempt))

	panics := logs.Message("consumer: handler panicked")
	require.Len(t, panics, 2, "one line per panic")
	for _, e := range panics {
		require.Equal(t, []string{"stack"}, e.StackKeys(), "no stack besides the panic's own")
		stack, _ := e.Attrs["stack"].(string)
		require.Equal(t, 1, strings.Count(stack, "panic_test.go"), "the panic's stack, once")
	}
	for _, e := range logs.All() {
		if e.Message != "consumer: handler panicked" {
			require.NotContains(t, e.Attrs, "stack", "no other line carries a stack: %s", e.Message)
			require.Empty(t, e.StackKeys(), "no other line carries a stack: %s", e.Message)
		}
	}
}
