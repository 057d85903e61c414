package logtest_test

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/logtest"
)

func TestRecorder(t *testing.T) {
	t.Parallel()
	logger, rec := logtest.New(slog.LevelInfo)
	logger.Debug("dropped")
	logger.With(slog.String("worker", "w-1")).WithGroup("g").Warn("kept",
		slog.Int("n", 3), slog.Duration("d", time.Second), slog.Any("error", errors.New("boom")),
		slog.Any("nil", nil), slog.Attr{}, slog.Group("", slog.Bool("inline", true)))

	require.Equal(t, 0, rec.Count("dropped"), "below the level")
	e := rec.Message("kept")
	require.Len(t, e, 1)
	require.Equal(t, slog.LevelWarn, e[0].Level)
	require.Equal(t, map[string]any{
		"worker": "w-1", "g.n": int64(3), "g.d": time.Second, "g.error": "boom", "g.nil": nil, "g.inline": true,
	}, e[0].Attrs)
	require.Len(t, rec.Containing("ep"), 1)
	require.Len(t, rec.All(), 1)
}

func TestEntry_StackKeys(t *testing.T) {
	t.Parallel()
	logger, rec := logtest.New(slog.LevelInfo)
	logger.Error("panicked", slog.String("stack", "goroutine 7 [running]:\nmain.go:1"), slog.String("panic", "boom"))
	require.Equal(t, []string{"stack"}, rec.All()[0].StackKeys())
}
