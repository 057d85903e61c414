package inboxmq

import (
	"log/slog"
	"math"

	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
)

// slogOf is the zap logger as a *slog.Logger, for the packages that log
// through slog already. It goes once the façade's Config.Logger is a
// *slog.Logger too.
// Like zap's production configuration under the observer, it adds no
// stack traces: lines that need one carry it.
func slogOf(l *zap.Logger) *slog.Logger {
	return slog.New(zapslog.NewHandler(l.Core(), zapslog.AddStacktraceAt(slog.Level(math.MaxInt))))
}
