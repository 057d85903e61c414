package inboxmq

import (
	"log/slog"

	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
)

// slogOf is the zap logger as a *slog.Logger, for the packages that log
// through slog already. It goes once the façade's Config.Logger is a
// *slog.Logger too.
func slogOf(l *zap.Logger) *slog.Logger { return slog.New(zapslog.NewHandler(l.Core())) }
