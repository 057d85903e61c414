package relay

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/inboxmq/inboxmq/internal/outboxwire"
)

// listen holds a dedicated connection (outside the pool) that LISTENs on
// outboxwire.NotifyChannel and wakes the relay loop for notifications
// about its own schema. Notifications are only hints: the loop also polls,
// so a lost LISTEN connection delays rows by at most PollInterval.
func (r *Relay) listen(ctx context.Context, wakes []chan struct{}) {
	bo := r.newBackOff()
	for ctx.Err() == nil {
		err := r.listenOnce(ctx, wakes, bo.Reset)
		if ctx.Err() != nil {
			return
		}
		d := bo.NextBackOff()
		r.log.LogAttrs(ctx, slog.LevelWarn, "outbox relay: LISTEN connection lost; polling meanwhile",
			slog.Any("error", err), slog.Duration("retry_in", d))
		sleep(ctx, d)
	}
}

func (r *Relay) listenOnce(ctx context.Context, wakes []chan struct{}, connected func()) error {
	conn, err := pgx.ConnectConfig(ctx, r.pool.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("relay: listen connect: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var schema string
	if err := conn.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return fmt.Errorf("relay: listen: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{outboxwire.NotifyChannel}.Sanitize()); err != nil {
		return fmt.Errorf("relay: listen: %w", err)
	}
	connected()
	notifyAll(wakes) // rows may have been enqueued while nobody listened
	if r.hooks.listening != nil {
		r.hooks.listening()
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("relay: listen: %w", err)
		}
		if n.Payload == schema {
			notifyAll(wakes)
		}
	}
}

// notifyAll wakes every lane.
func notifyAll(wakes []chan struct{}) {
	for _, w := range wakes {
		notify(w)
	}
}

// notify wakes the loop without blocking (one pending wake is enough).
func notify(wake chan<- struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}
