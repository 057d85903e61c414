package ops

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxmq/inboxmq/inbox"
)

// StatusCount is the number of inbox rows of one namespace in one status.
type StatusCount struct {
	Namespace string `json:"namespace"`
	Status    string `json:"status"`
	Count     int64  `json:"count"`
}

// Stats are the inbox's row counts, its oldest claim and its size.
type Stats struct {
	Rows                  []StatusCount `json:"rows"`
	OldestClaimAgeSeconds *float64      `json:"oldest_claim_age_seconds"`
	StaleClaims           int64         `json:"stale_claims"`
	TableBytes            int64         `json:"table_bytes"`
	IndexBytes            int64         `json:"index_bytes"`
	TotalBytes            int64         `json:"total_bytes"`
	EstimatedRows         int64         `json:"estimated_rows"`
}

// InboxStats counts s's rows by namespace and status (a full scan), and
// reads the oldest live claim's age, the claims past their lease and the
// table's and indexes' sizes.
func InboxStats(ctx context.Context, s *inbox.Store) (*Stats, error) {
	t := s.Table()
	var v Stats
	rows, err := s.Pool().Query(ctx, `SELECT consumer, status, count(*) FROM `+t+` GROUP BY 1, 2 ORDER BY 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("stats: %w", err)
	}
	v.Rows, err = pgx.CollectRows(rows, pgx.RowToStructByPos[StatusCount])
	if err != nil {
		return nil, fmt.Errorf("stats: %w", err)
	}
	// tree is the table and, if it is partitioned, its partitions.
	err = s.Pool().QueryRow(ctx, `WITH tree(r) AS (
		SELECT to_regclass($1) UNION SELECT relid FROM pg_partition_tree(to_regclass($1)))
	SELECT
		(SELECT EXTRACT(EPOCH FROM now() - min(updated_at))::float8 FROM `+t+` WHERE status = 'processing'),
		(SELECT count(*) FROM `+t+` WHERE status = 'processing' AND lease_until < now()),
		(SELECT sum(pg_relation_size(r))::bigint FROM tree),
		(SELECT sum(pg_indexes_size(r))::bigint FROM tree),
		(SELECT sum(pg_total_relation_size(r))::bigint FROM tree),
		(SELECT sum(greatest(reltuples, 0))::bigint FROM pg_class WHERE oid IN (SELECT r FROM tree) AND relkind = 'r')`, t,
	).Scan(&v.OldestClaimAgeSeconds, &v.StaleClaims, &v.TableBytes, &v.IndexBytes, &v.TotalBytes, &v.EstimatedRows)
	if err != nil {
		return nil, fmt.Errorf("stats: %w", err)
	}
	return &v, nil
}

// Bounded runs fn in a read-only transaction whose statements are cut off
// after timeout (SET LOCAL statement_timeout), so a page or a command
// cannot keep a busy database working on a slow scan. The transaction is
// always rolled back: fn only reads.
func Bounded(ctx context.Context, pool *pgxpool.Pool, timeout time.Duration, fn func(tx pgx.Tx) error) error {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("ops: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", max(timeout.Milliseconds(), 1))); err != nil {
		return fmt.Errorf("ops: statement timeout: %w", err)
	}
	return fn(tx)
}
