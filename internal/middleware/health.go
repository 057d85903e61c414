package middleware

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inboxmq/inboxmq/retry"
)

// health tracks whether Redis answers, for the Redis-backed middleware. It
// reports each change once (hook and log) and, while degraded, lets one
// probe through per probe interval.
type health struct {
	name     string
	probe    time.Duration
	logger   *slog.Logger
	hook     func(bool)
	degraded atomic.Bool
	// nextProbe is the UnixNano time after which a probe may run.
	nextProbe atomic.Int64
	mu        sync.Mutex
}

func newHealth(name string, probe time.Duration, logger *slog.Logger, hook func(bool)) *health {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &health{name: name, probe: probe, logger: logger, hook: hook}
}

// allow reports whether this call should try Redis.
func (h *health) allow() bool {
	if !h.degraded.Load() || h.probe < 0 {
		return true
	}
	now := time.Now().UnixNano()
	next := h.nextProbe.Load()
	return now >= next && h.nextProbe.CompareAndSwap(next, now+int64(h.probe))
}

// set records the outcome of a Redis call: degraded after an error, healthy
// after an answer.
func (h *health) set(degraded bool, err error) {
	if h.degraded.Load() == degraded {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.degraded.Load() == degraded {
		return
	}
	if degraded {
		h.nextProbe.Store(time.Now().Add(h.probe).UnixNano())
	}
	h.degraded.Store(degraded)
	if degraded {
		h.logger.LogAttrs(context.Background(), slog.LevelWarn, "redis unavailable: proceeding without it",
			slog.String("middleware", h.name), slog.Any("error", err))
	} else {
		h.logger.LogAttrs(context.Background(), slog.LevelInfo, "redis answers again", slog.String("middleware", h.name))
	}
	if h.hook != nil {
		h.hook(degraded)
	}
}

// errNoKey is the permanent error of a keyed middleware (Lock, Cache) that
// got a delivery without an idempotency key: a misconfiguration, which
// must not silently do nothing. The consumer dead-letters the delivery.
func errNoKey(name string) error {
	return retry.Permanent(fmt.Errorf(
		"middleware: %s got a delivery without an idempotency key: mount it in HandlerOpts.Middleware of a route whose payload implements inboxtype.Keyer", name))
}
