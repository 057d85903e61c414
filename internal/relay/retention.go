package relay

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

const purgeSQL = `DELETE FROM inboxmq_outbox WHERE id IN (
	SELECT id FROM inboxmq_outbox
	WHERE sent_at IS NOT NULL AND sent_at < clock_timestamp() - make_interval(secs => $1)
	ORDER BY sent_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED)`

// PurgeSent deletes the rows sent longer than Config.Retention ago, in
// batches of RetentionBatchSize (one short transaction each), and returns
// how many it deleted. Pending rows are never deleted. With Retention -1 it
// does nothing. A running relay calls it every retentionInterval; tests
// call it directly.
func (r *Relay) PurgeSent(ctx context.Context) (int64, error) {
	if r.cfg.Retention < 0 {
		return 0, nil
	}
	var total int64
	for {
		tag, err := r.pool.Exec(ctx, purgeSQL, r.cfg.Retention.Seconds(), r.cfg.RetentionBatchSize)
		if err != nil {
			return total, fmt.Errorf("relay: purge sent rows: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(r.cfg.RetentionBatchSize) {
			return total, nil
		}
	}
}

// retain runs PurgeSent every retentionInterval until ctx is done.
func (r *Relay) retain(ctx context.Context) {
	t := time.NewTicker(retentionInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := r.PurgeSent(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			r.log.LogAttrs(ctx, slog.LevelWarn, "outbox relay: retention failed", slog.Any("error", err), slog.Int64("deleted", n))
		case n > 0:
			r.log.LogAttrs(ctx, slog.LevelDebug, "outbox relay: retention deleted sent rows", slog.Int64("deleted", n))
		}
	}
}
