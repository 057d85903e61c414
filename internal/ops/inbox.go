package ops

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Querier is the narrow database interface of the inbox reads; pgx.Tx
// (from [Bounded]), *pgxpool.Pool and *pgx.Conn satisfy it.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Summary is one namespace's inbox at one moment.
type Summary struct {
	Namespace string
	// Received … Dead count the rows in each status.
	Received, Processing, Completed, Failed, Dead int64
	// OldestClaim is the age of the oldest claim (status processing),
	// nil when there is none.
	OldestClaim *time.Duration
	// StaleClaims counts the claims past their lease.
	StaleClaims int64
	// Completed1m and Completed5m count the rows completed in the last
	// minute and five minutes; Failed1m and Failed5m the rows whose last
	// failure falls in them.
	Completed1m, Completed5m, Failed1m, Failed5m int64
}

// Summarize reads namespace's rows of the inbox table (a quoted name such
// as inbox.Store.Table returns): counts by status, the oldest claim, the
// stale claims and the completions and failures of the last minutes. It
// scans the namespace's rows once; run it under [Bounded].
func Summarize(ctx context.Context, q Querier, table, namespace string) (*Summary, error) {
	s := Summary{Namespace: namespace}
	var oldest *float64
	err := q.QueryRow(ctx, `SELECT
		count(*) FILTER (WHERE status = 'received'),
		count(*) FILTER (WHERE status = 'processing'),
		count(*) FILTER (WHERE status = 'completed'),
		count(*) FILTER (WHERE status = 'failed'),
		count(*) FILTER (WHERE status = 'dead'),
		EXTRACT(EPOCH FROM now() - min(updated_at) FILTER (WHERE status = 'processing'))::float8,
		count(*) FILTER (WHERE status = 'processing' AND lease_until < now()),
		count(*) FILTER (WHERE completed_at > now() - interval '1 minute'),
		count(*) FILTER (WHERE completed_at > now() - interval '5 minutes'),
		count(*) FILTER (WHERE last_failed_at > now() - interval '1 minute'),
		count(*) FILTER (WHERE last_failed_at > now() - interval '5 minutes')
		FROM `+table+` WHERE consumer = $1`, namespace,
	).Scan(&s.Received, &s.Processing, &s.Completed, &s.Failed, &s.Dead, &oldest, &s.StaleClaims,
		&s.Completed1m, &s.Completed5m, &s.Failed1m, &s.Failed5m)
	if err != nil {
		return nil, fmt.Errorf("summarize %s: %w", namespace, err)
	}
	if oldest != nil {
		d := time.Duration(*oldest * float64(time.Second))
		s.OldestClaim = &d
	}
	return &s, nil
}

// KeyRow is one line of a key search.
type KeyRow struct {
	Key       string
	Status    string
	Attempts  int
	Fence     int64
	LastError *string
	UpdatedAt time.Time
}

// SearchKeys lists namespace's keys that start with prefix ("" for every
// key), in key order after the key after ("" from the start), at most limit.
func SearchKeys(ctx context.Context, q Querier, table, namespace, prefix, after string, limit int) ([]KeyRow, error) {
	rows, err := q.Query(ctx, `SELECT key, status, attempts, fence, last_error, updated_at FROM `+table+`
		WHERE consumer = $1 AND key >= $2 AND starts_with(key, $2) AND key > $3
		ORDER BY key LIMIT $4`, namespace, prefix, after, limit)
	if err != nil {
		return nil, fmt.Errorf("search keys: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[KeyRow])
	if err != nil {
		return nil, fmt.Errorf("search keys: %w", err)
	}
	return out, nil
}

// Payload is a row's stored payload, cut to a limit.
type Payload struct {
	// Bytes is the payload's full length; 0 with Kept false when the row
	// keeps no payload.
	Bytes int
	Kept  bool
	// Head is at most the limit's first bytes.
	Head []byte
}

// StoredPayload reads at most limit bytes of the payload stored with
// (namespace, key); a missing row or payload reads as not kept.
func StoredPayload(ctx context.Context, q Querier, table, namespace, key string, limit int) (Payload, error) {
	var (
		p Payload
		n *int
	)
	rows, err := q.Query(ctx, `SELECT octet_length(payload), substring(payload FROM 1 FOR $3) FROM `+table+`
		WHERE consumer = $1 AND key = $2`, namespace, key, limit)
	if err != nil {
		return p, fmt.Errorf("stored payload: %w", err)
	}
	defer rows.Close()
	if rows.Next() {
		if err := rows.Scan(&n, &p.Head); err != nil {
			return p, fmt.Errorf("stored payload: %w", err)
		}
	}
	if err := rows.Err(); err != nil {
		return p, fmt.Errorf("stored payload: %w", err)
	}
	if n != nil {
		p.Bytes, p.Kept = *n, true
	}
	return p, nil
}

// KeyStatuses returns the inbox status of each of keys that has a row for
// consumer.
func KeyStatuses(ctx context.Context, q Querier, table, namespace string, keys []string) (map[string]string, error) {
	out := make(map[string]string, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	rows, err := q.Query(ctx, `SELECT key, status FROM `+table+` WHERE consumer = $1 AND key = ANY($2)`, namespace, keys)
	if err != nil {
		return nil, fmt.Errorf("key statuses: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k, s string
		if err := rows.Scan(&k, &s); err != nil {
			return nil, fmt.Errorf("key statuses: %w", err)
		}
		out[k] = s
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("key statuses: %w", err)
	}
	return out, nil
}

// Namespaces lists the distinct namespaces of the inbox table, at most
// limit (a skip scan over the primary key, cheap on a large table).
func Namespaces(ctx context.Context, q Querier, table string, limit int) ([]string, error) {
	rows, err := q.Query(ctx, `WITH RECURSIVE c(consumer) AS (
		(SELECT consumer FROM `+table+` ORDER BY consumer LIMIT 1)
		UNION ALL
		SELECT (SELECT consumer FROM `+table+` WHERE consumer > c.consumer ORDER BY consumer LIMIT 1)
		FROM c WHERE c.consumer IS NOT NULL)
		SELECT consumer FROM c WHERE consumer IS NOT NULL LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("namespaces: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("namespaces: %w", err)
	}
	return out, nil
}
