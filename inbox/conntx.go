package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// connTx is a transaction of the inbox's own (the per-message path's and
// a group commit's) on a connection the inbox acquired itself, so that the
// statements that end it can travel in the COMMIT's round trip: the
// handlers' results are written in one statement pipelined with COMMIT
// (commitResults) instead of one round trip each. Ending it releases the
// connection; a connection left inside a transaction by a failure is
// destroyed by the pool on release.
type connTx struct {
	pgx.Tx // the transaction begun on conn by the claim's batch
	conn   *pgxpool.Conn
	ended  bool
}

// beginBatch acquires a connection and sends b (which begins a
// transaction with pgx.Batch.BeginTx) on it.
func (s *Store) beginBatch(ctx context.Context, b *pgx.Batch) (*connTx, pgx.BatchResults, error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, infraError(ReasonDBConnection, fmt.Errorf("inbox: begin: %w", err))
	}
	br := c.Conn().SendBatch(ctx, b)
	return &connTx{Tx: br.Tx(), conn: c}, br, nil
}

// Commit commits the transaction and releases its connection.
func (t *connTx) Commit(ctx context.Context) error {
	if t.ended {
		return pgx.ErrTxClosed
	}
	t.ended = true
	defer t.conn.Release()
	return t.Tx.Commit(ctx)
}

// Rollback rolls back the transaction (if it is still open) and releases
// its connection. It is safe to call after Commit.
func (t *connTx) Rollback(ctx context.Context) error {
	if t.ended {
		return pgx.ErrTxClosed
	}
	t.ended = true
	defer t.conn.Release()
	return t.Tx.Rollback(ctx)
}

// commitResults writes the results the units' handlers left (unit.pending)
// and commits, in one round trip; without results it is a plain COMMIT.
// A failure is a failed COMMIT's (ReasonDBCommit): the writes may or may
// not have committed, and the callers rerun the deliveries, which are then
// duplicates if they did.
func (s *Store) commitResults(ctx context.Context, tx pgx.Tx, units []*unit) error {
	ct, ok := tx.(*connTx)
	var consumers, keys, results []string
	for _, u := range units {
		if u.pending != nil && u.err == nil { // a failed handler's writes rolled back to its savepoint
			consumers, keys, results = append(consumers, u.consumer), append(keys, u.key), append(results, string(u.pending))
		}
	}
	if len(results) == 0 {
		return commit(ctx, tx)
	}
	if !ok {
		// Not a transaction of the inbox's own connection (the claim
		// steps always begin one): the results go in a statement first.
		if _, err := tx.Exec(ctx, s.sql.setResults, consumers, keys, results); err != nil {
			return MapError(fmt.Errorf("inbox: store result: %w", err))
		}
		return commit(ctx, tx)
	}
	if ct.ended {
		return infraError(ReasonDBCommit, fmt.Errorf("inbox: commit: %w", pgx.ErrTxClosed))
	}
	ct.ended = true
	defer ct.conn.Release() // a connection still in a transaction is destroyed
	b := &pgx.Batch{}
	if len(results) == 1 {
		b.Queue(s.sql.setResult, consumers[0], keys[0], results[0])
	} else {
		b.Queue(s.sql.setResults, consumers, keys, results)
	}
	b.Queue("commit")
	br := ct.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		// PostgreSQL refused a result (bytes that are not UTF-8): MapError
		// makes that permanent, as it was when the handler's own statement
		// wrote it; a lone delivery's rerun then fails alone.
		if perr := (*pgconn.PgError)(nil); errors.As(err, &perr) {
			return MapError(fmt.Errorf("inbox: store result: %w", err))
		}
		return infraError(ReasonDBCommit, fmt.Errorf("inbox: commit: %w", err))
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		return infraError(ReasonDBCommit, fmt.Errorf("inbox: commit: %w", err))
	case tag.String() == "ROLLBACK":
		return infraError(ReasonDBCommit, fmt.Errorf("inbox: commit: %w", pgx.ErrTxCommitRollback))
	}
	return nil
}
