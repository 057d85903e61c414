package middleware_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/clip"
	"github.com/inboxmq/inboxmq/middleware"
	"github.com/inboxmq/inboxmq/retry"
)

func TestRecover_PanicBecomesError(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zapcore.ErrorLevel)
	mw := middleware.Recover(&middleware.RecoverOpts{Logger: zap.New(core)})

	err := mw(func(context.Context, *inboxtype.Delivery) error {
		panic("nil map write")
	})(t.Context(), keyedDelivery("k"))

	require.EqualError(t, err, "middleware: panic: nil map write")
	var perr *middleware.PanicError
	require.ErrorAs(t, err, &perr)
	require.Equal(t, "nil map write", perr.Value)
	require.Contains(t, string(perr.Stack), "recover_test.go", "the stack points at the panic")
	dec := retry.Classify(err)
	require.Equal(t, retry.KindRetry, dec.Kind, "retried under the policy, then dead-lettered")
	require.Equal(t, retry.ReasonPanic, dec.Reason)

	require.Equal(t, 1, logs.Len())
	entry := logs.All()[0]
	require.Equal(t, "handler panicked", entry.Message)
	require.Equal(t, "k", entry.ContextMap()["idempotency_key"])
	require.Contains(t, entry.ContextMap()["stack"], "recover_test.go")
}

func TestRecover_ErrorValueUnwraps(t *testing.T) {
	t.Parallel()
	mw := middleware.Recover(nil)
	err := mw(func(context.Context, *inboxtype.Delivery) error {
		panic(io.ErrUnexpectedEOF)
	})(t.Context(), keyedDelivery("k"))
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	require.Equal(t, retry.ReasonPanic, retry.Classify(err).Reason)
}

func TestRecover_NoPanicPassesThrough(t *testing.T) {
	t.Parallel()
	mw := middleware.Recover(nil)
	boom := errors.New("boom")
	require.ErrorIs(t, mw(func(context.Context, *inboxtype.Delivery) error { return boom })(t.Context(), keyedDelivery("k")), boom)
	require.NoError(t, mw(func(context.Context, *inboxtype.Delivery) error { return nil })(t.Context(), keyedDelivery("k")))
}

// A panic whose value quotes a huge payload logs the value cut to 1 KiB,
// and its stack once (the "stack" field), not again as zap's stacktrace.
func TestRecover_PanicLineIsBoundedWithOneStack(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zapcore.ErrorLevel)
	logger := zap.New(core, zap.AddStacktrace(zapcore.ErrorLevel)) // as zap.NewProduction
	mw := middleware.Recover(&middleware.RecoverOpts{Logger: logger})

	_ = mw(func(context.Context, *inboxtype.Delivery) error {
		panic(errors.New("bad amount " + strings.Repeat("9", 1<<20)))
	})(t.Context(), keyedDelivery("k"))

	require.Equal(t, 1, logs.Len())
	entry := logs.All()[0]
	require.Empty(t, entry.Stack, "no stacktrace besides the panic's own")
	value, _ := entry.ContextMap()["panic"].(string)
	require.Len(t, value, clip.Limit)
	require.True(t, strings.HasPrefix(value, "bad amount 999"))
	require.Contains(t, entry.ContextMap()["stack"], "recover_test.go")
}
