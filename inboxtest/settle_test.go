package inboxtest_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtest"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// The harness decides and settles each delivery as the consumer does: a
// handler's own interruption (a dependency dropped) is an uncounted retry,
// delivered again with the same attempt, and the route's middleware sees
// every delivery settled, so each span it starts ends with the outcome.
func TestHarnessSettlesAsTheConsumerDoes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	var mu sync.Mutex
	seen := map[string][]int{} // the attempts each order's handler saw
	fn := func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[Payment]) error {
		mu.Lock()
		seen[msg.Body.OrderID] = append(seen[msg.Body.OrderID], msg.Attempt)
		first := len(seen[msg.Body.OrderID]) == 1
		mu.Unlock()
		if first {
			return retry.Interrupted(errors.New("ledger connection dropped"))
		}
		return ledger(ctx, tx, msg)
	}
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, fn, nil)
	w, err := inboxmq.NewWorker(&inboxmq.Config{
		URL: testenv.AMQPURL(), DB: b.pool, Routes: routes, TracerProvider: tp, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	b.subject.Worker = w
	b.subject.Faults = nil // only the scenarios without faults

	results, err := inboxtest.Check(t.Context(), b.subject)
	require.NoError(t, err)
	seq := results[0]
	require.Equal(t, inboxtest.SequentialDuplicates, seq.Scenario)
	require.True(t, seq.OK(), "%v", seq.Failures)
	require.Equal(t, []string{"retry", "succeeded", "duplicate", "duplicate"}, seq.Outcomes)
	mu.Lock()
	require.Equal(t, []int{1, 1}, seen[strings.TrimPrefix(seq.Key, "payment:")], "an uncounted retry keeps its attempt")
	mu.Unlock()

	var started int
	for _, s := range rec.Started() {
		if s.Name() == "process "+b.queue {
			started++
		}
	}
	ended := map[string]int{}
	for _, s := range rec.Ended() {
		if s.Name() != "process "+b.queue {
			continue
		}
		for _, kv := range s.Attributes() {
			if kv.Key == "inboxmq.action" {
				ended[kv.Value.AsString()]++
			}
		}
	}
	require.Positive(t, started)
	var n int
	for _, c := range ended {
		n += c
	}
	require.Equal(t, started, n, "every span the route started ended, with the action: %v", ended)
	require.Positive(t, ended["retried"])
	require.Positive(t, ended["acked"])
}
