package middleware_test

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/middleware"
	"github.com/inboxmq/inboxmq/retry"
)

func TestRecover_PanicBecomesError(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zapcore.ErrorLevel)
	mw := middleware.Recover(&middleware.RecoverOpts{Logger: zap.New(core)})

	err := mw(func(context.Context, *consumer.Delivery) error {
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
	require.Equal(t, "k", entry.ContextMap()[middleware.LogFieldIdempotencyKey])
	require.Contains(t, entry.ContextMap()["stack"], "recover_test.go")
}

func TestRecover_ErrorValueUnwraps(t *testing.T) {
	t.Parallel()
	mw := middleware.Recover(nil)
	err := mw(func(context.Context, *consumer.Delivery) error {
		panic(io.ErrUnexpectedEOF)
	})(t.Context(), keyedDelivery("k"))
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	require.Equal(t, retry.ReasonPanic, retry.Classify(err).Reason)
}

func TestRecover_NoPanicPassesThrough(t *testing.T) {
	t.Parallel()
	mw := middleware.Recover(nil)
	boom := errors.New("boom")
	require.ErrorIs(t, mw(func(context.Context, *consumer.Delivery) error { return boom })(t.Context(), keyedDelivery("k")), boom)
	require.NoError(t, mw(func(context.Context, *consumer.Delivery) error { return nil })(t.Context(), keyedDelivery("k")))
}
