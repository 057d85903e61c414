package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	savepointSQL   = "SAVEPOINT inboxmq_delivery"
	rollbackToSQL  = "ROLLBACK TO SAVEPOINT inboxmq_delivery"
	savepointLabel = "inbox: savepoint"
)

// lazySavepoint is the transaction a handler of a group commit sees: the
// batch's transaction, with the delivery's SAVEPOINT sent lazily — queued
// in one pipeline with the handler's first Exec, which saves a round trip
// per delivery; before any other first call it is sent on its own. A
// handler that runs no statement never pays for it.
type lazySavepoint struct {
	pgx.Tx
	sent bool
}

func (t *lazySavepoint) ensure(ctx context.Context) error {
	if t.sent {
		return nil
	}
	if _, err := t.Tx.Exec(ctx, savepointSQL); err != nil {
		return fmt.Errorf("%s: %w", savepointLabel, err)
	}
	t.sent = true
	return nil
}

// Exec runs sql; the first one carries the savepoint in its pipeline.
func (t *lazySavepoint) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.sent || (len(args) > 0 && isExecMode(args[0])) {
		if err := t.ensure(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		return t.Tx.Exec(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(savepointSQL)
	b.Queue(sql, args...)
	br := t.Tx.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return pgconn.CommandTag{}, fmt.Errorf("%s: %w", savepointLabel, err)
	}
	t.sent = true
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// errHandlerEndsTx is what a group-commit handler gets if it tries to end
// the batch's transaction: committing it would commit the other
// deliveries' claims before their handlers ran.
var errHandlerEndsTx = errors.New("inbox: a handler must not commit or roll back the batch's transaction; return an error to roll back its own writes")

// Commit refuses: the batch commits, not its handlers.
func (t *lazySavepoint) Commit(context.Context) error { return errHandlerEndsTx }

// Rollback refuses: return an error from the handler instead.
func (t *lazySavepoint) Rollback(context.Context) error { return errHandlerEndsTx }

func isExecMode(a any) bool {
	_, ok := a.(pgx.QueryExecMode)
	return ok
}

// Query runs sql after the savepoint.
func (t *lazySavepoint) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.ensure(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Query(ctx, sql, args...)
}

// QueryRow runs sql after the savepoint.
func (t *lazySavepoint) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.ensure(ctx); err != nil {
		return errRow{err}
	}
	return t.Tx.QueryRow(ctx, sql, args...)
}

// SendBatch sends b after the savepoint; the first call carries the
// savepoint in the same round trip, ahead of b's queries (its result is
// read here, so the caller reads b's results only).
func (t *lazySavepoint) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.sent || b == nil || len(b.QueuedQueries) == 0 {
		if err := t.ensure(ctx); err != nil {
			return errBatch{err}
		}
		return t.Tx.SendBatch(ctx, b)
	}
	sb := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(b.QueuedQueries)+1)}
	sb.Queue(savepointSQL)
	sb.QueuedQueries = append(sb.QueuedQueries, b.QueuedQueries...)
	br := t.Tx.SendBatch(ctx, sb)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return errBatch{fmt.Errorf("%s: %w", savepointLabel, err)}
	}
	t.sent = true
	return br
}

// CopyFrom copies after the savepoint.
func (t *lazySavepoint) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.ensure(ctx); err != nil {
		return 0, err
	}
	return t.Tx.CopyFrom(ctx, table, columns, src)
}

// Prepare prepares after the savepoint.
func (t *lazySavepoint) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.ensure(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Prepare(ctx, name, sql)
}

// Begin starts a nested savepoint after the delivery's.
func (t *lazySavepoint) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.ensure(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Begin(ctx)
}

// LargeObjects sends the savepoint first: large-object calls bypass the
// wrapper. Having no context, it is bounded by the default cleanup timeout;
// if the savepoint fails, so does every later statement of the aborted
// transaction, and the batch with it.
func (t *lazySavepoint) LargeObjects() pgx.LargeObjects {
	t.ensureNoCtx()
	return t.Tx.LargeObjects()
}

// Conn sends the savepoint first: statements on the connection bypass the
// wrapper (see LargeObjects).
func (t *lazySavepoint) Conn() *pgx.Conn {
	t.ensureNoCtx()
	return t.Tx.Conn()
}

func (t *lazySavepoint) ensureNoCtx() {
	ctx, cancel := context.WithTimeout(context.Background(), defaultCleanupTimeout)
	defer cancel()
	_ = t.ensure(ctx)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }
