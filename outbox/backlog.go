package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Backlog is the outbox's unsent rows at one moment.
type Backlog struct {
	// Pending is the number of rows not yet confirmed by the broker. A
	// retry the worker scheduled in the outbox counts from its due time.
	Pending int64
	// OldestAge is the age of the oldest pending row; 0 when none is
	// pending.
	OldestAge time.Duration
}

// Querier is the narrow database interface [ReadBacklog] needs;
// *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

const backlogSQL = `SELECT count(*), coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)::float8
FROM inboxmq_outbox WHERE sent_at IS NULL AND created_at <= clock_timestamp()`

// ReadBacklog counts the outbox's pending rows and the age of the oldest
// (the relay's pending and oldest-age gauges, and the operator console's
// figures).
func ReadBacklog(ctx context.Context, db Querier) (Backlog, error) {
	var (
		b   Backlog
		age float64
	)
	if err := db.QueryRow(ctx, backlogSQL).Scan(&b.Pending, &age); err != nil {
		return Backlog{}, fmt.Errorf("outbox: backlog: %w", err)
	}
	b.OldestAge = time.Duration(age * float64(time.Second))
	return b, nil
}
