package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// completeBare completes a claim that has no business writes: the fenced
// completion, which also stores result (nil for none, already checked
// against MaxResultBytes), is then the whole transaction, sent as one
// autocommit statement — one round trip where BEGIN + completion, the
// result and COMMIT take two or three. It commits as durably as a COMMIT:
// the claim's asynchronous commit is local to the claim's own statement.
// Zero rows is the fenced verdict, as in start; an error may hide a
// completion that did commit, as a failed COMMIT may, and is retried alike
// (the release that follows is fenced and leaves a completed row alone).
// PostgreSQL refusing the result (bytes that are not UTF-8) committed
// nothing, and is classified by MapError, as when a statement writes it.
func (c *Claim) completeBare(ctx context.Context, result []byte) error {
	var arg any
	if result != nil {
		arg = string(result)
	}
	tag, err := c.s.pool.Exec(ctx, c.s.sql.completeWith, c.Consumer, c.Key, c.Token, c.Fence, arg)
	if err != nil {
		if perr := (*pgconn.PgError)(nil); result != nil && errors.As(err, &perr) && sqlClass(perr.Code) == "22" {
			return MapError(fmt.Errorf("inbox: store result: %w", err))
		}
		return infraError(ReasonDBCommit, fmt.Errorf("inbox: complete: %w", err))
	}
	if tag.RowsAffected() == 0 {
		return c.lost(ctx)
	}
	return nil
}

// completionTx is the transaction Claim.Complete hands to its fn. It starts
// lazily: BEGIN and the fenced completion travel in one pipeline with fn's
// first Exec, which saves a round trip per delivery. If the completion finds
// the claim taken over, that first Exec's effect dies with the rollback and
// fn gets the fenced error (a duplicate).
type completionTx struct {
	c      *Claim
	tx     *connTx // on a connection of its own, so that COMMIT can carry the result
	fenced bool
	err    error     // the start's error, repeated to every later call
	b      pgx.Batch // the start's pipeline, kept here to save an allocation
}

// start sends BEGIN and the fenced completion, with sql (if not empty) in
// the same pipeline, and returns sql's command tag.
func (t *completionTx) start(ctx context.Context, sql string, args []any) (pgconn.CommandTag, error) {
	if t.tx != nil || t.err != nil {
		return pgconn.CommandTag{}, t.err
	}
	b := &t.b
	b.BeginTx(pgx.TxOptions{})
	b.Queue(t.c.s.sql.completeWith, t.c.Consumer, t.c.Key, t.c.Token, t.c.Fence, nil)
	if sql != "" {
		b.Queue(sql, args...)
	}
	tx, br, err := t.c.s.beginBatch(ctx, b)
	if err != nil {
		t.err = err
		return pgconn.CommandTag{}, err
	}
	t.tx = tx
	_, err = br.Exec() // BEGIN
	var done, tag pgconn.CommandTag
	if err == nil {
		done, err = br.Exec()
	}
	var stmtErr error
	if err == nil && sql != "" {
		tag, stmtErr = br.Exec()
	}
	if cerr := br.Close(); err == nil && stmtErr == nil {
		stmtErr = cerr
	}
	switch {
	case err != nil:
		t.err = infraError(ReasonDBConnection, fmt.Errorf("inbox: complete: %w", err))
	case done.RowsAffected() == 0:
		t.fenced = true
		t.err = t.c.lost(ctx)
	}
	if t.err != nil {
		return pgconn.CommandTag{}, t.err
	}
	return tag, stmtErr
}

func (t *completionTx) ensure(ctx context.Context) error {
	if t.tx == nil && t.err == nil {
		_, _ = t.start(ctx, "", nil)
	}
	return t.err
}

// Exec runs sql; the first one carries BEGIN and the fenced completion.
func (t *completionTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.tx == nil && t.err == nil && (len(args) == 0 || !isExecMode(args[0])) {
		return t.start(ctx, sql, args)
	}
	if err := t.ensure(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.tx.Exec(ctx, sql, args...)
}

// Query runs sql after the completion.
func (t *completionTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.ensure(ctx); err != nil {
		return nil, err
	}
	return t.tx.Query(ctx, sql, args...)
}

// QueryRow runs sql after the completion.
func (t *completionTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.ensure(ctx); err != nil {
		return errRow{err}
	}
	return t.tx.QueryRow(ctx, sql, args...)
}

// SendBatch sends b after the completion.
func (t *completionTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.ensure(ctx); err != nil {
		return errBatch{err}
	}
	return t.tx.SendBatch(ctx, b)
}

// CopyFrom copies after the completion.
func (t *completionTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.ensure(ctx); err != nil {
		return 0, err
	}
	return t.tx.CopyFrom(ctx, table, columns, src)
}

// Prepare prepares after the completion.
func (t *completionTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.ensure(ctx); err != nil {
		return nil, err
	}
	return t.tx.Prepare(ctx, name, sql)
}

// Begin starts a savepoint after the completion.
func (t *completionTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.ensure(ctx); err != nil {
		return nil, err
	}
	return t.tx.Begin(ctx)
}

// Commit commits (Complete does it; fn need not).
func (t *completionTx) Commit(ctx context.Context) error {
	if err := t.ensure(ctx); err != nil {
		return err
	}
	return t.tx.Commit(ctx)
}

// Rollback rolls back; without a started transaction there is nothing to do.
func (t *completionTx) Rollback(ctx context.Context) error {
	if t.tx == nil {
		return nil
	}
	return t.tx.Rollback(ctx)
}

// LargeObjects starts the transaction first (bounded by the cleanup
// timeout, having no context).
func (t *completionTx) LargeObjects() pgx.LargeObjects {
	t.ensureNoCtx()
	if t.tx == nil {
		return pgx.LargeObjects{}
	}
	return t.tx.LargeObjects()
}

// Conn starts the transaction first; statements on the connection bypass
// the wrapper.
func (t *completionTx) Conn() *pgx.Conn {
	t.ensureNoCtx()
	if t.tx == nil {
		return nil
	}
	return t.tx.Conn()
}

func (t *completionTx) ensureNoCtx() {
	ctx, cancel := context.WithTimeout(context.Background(), defaultCleanupTimeout)
	defer cancel()
	_ = t.ensure(ctx)
}
