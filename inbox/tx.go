package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// lazyTx is the inbox's one pgx.Tx, in every mode. It is either
//
//   - a transaction of the inbox's own connection (conn), begun by the
//     claim's round trip (beginBatch) or lazily, BEGIN and the fenced
//     completion travelling with the first statement (claim mode's
//     Complete, leadCompletion); the inbox ends it (commitResults,
//     rollback), so that the statements that end it can share the COMMIT's
//     round trip, and then releases the connection; or
//   - a delivery's view of a group commit's transaction (tx is the batch's
//     lazyTx): its SAVEPOINT travels with its first statement
//     (leadSavepoint).
//
// What goes ahead of the first statement (the lead) rides in that
// statement's round trip when the statement is an Exec (or, for a
// savepoint, a SendBatch); before any other first call it is sent alone. A
// handler that sends nothing never pays for it. A handler cannot end the
// transaction (Commit and Rollback fail), and once the inbox ended it every
// call fails with pgx.ErrTxClosed. It is not safe for concurrent use.
type lazyTx struct {
	// tx receives the statements once the lead went: pgx's transaction on
	// conn, or the batch's lazyTx.
	tx   pgx.Tx
	conn *pgxpool.Conn // the inbox's own connection, until the transaction ends
	// claim is the claim whose fenced completion leadCompletion sends.
	claim *Claim
	err   error     // the lead's failure, repeated to every later call
	b     pgx.Batch // the lead's round trip, kept here to save an allocation
	lead  lead
	ended bool // the inbox ended the transaction
}

// lead is what goes ahead of a lazyTx's first statement.
type lead uint8

const (
	leadNone       lead = iota // sent, or nothing to send
	leadSavepoint              // the delivery's SAVEPOINT, in a batch's transaction
	leadCompletion             // BEGIN and the claim's fenced completion, on a connection of its own
)

const (
	savepointSQL  = "SAVEPOINT inboxmq_delivery"
	rollbackToSQL = "ROLLBACK TO SAVEPOINT inboxmq_delivery"
)

// errHandlerEndsTx is what a handler gets if it tries to end the inbox's
// transaction: the inbox commits it with the key (and, in a batch, with
// the other deliveries' claims, which must not commit before their
// handlers ran).
var errHandlerEndsTx = errors.New("inbox: a handler must not commit or roll back the inbox's transaction; return an error to roll back its own writes")

// errFenced is readLead's word that the fenced completion found no claim.
var errFenced = errors.New("inbox: fenced")

var _ pgx.Tx = (*lazyTx)(nil)

// beginBatch acquires a connection and sends b (which begins a
// transaction with pgx.Batch.BeginTx) on it: the returned transaction is
// the inbox's own, and br holds b's results.
func (s *Store) beginBatch(ctx context.Context, b *pgx.Batch) (*lazyTx, pgx.BatchResults, error) {
	t := &lazyTx{}
	br, err := t.begin(ctx, s.pool, b)
	if err != nil {
		return nil, nil, err
	}
	return t, br, nil
}

func (t *lazyTx) begin(ctx context.Context, pool *pgxpool.Pool, b *pgx.Batch) (pgx.BatchResults, error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return nil, infraError(ReasonDBConnection, fmt.Errorf("inbox: begin: %w", err))
	}
	br := c.Conn().SendBatch(ctx, b)
	t.conn, t.tx = c, br.Tx()
	return br, nil
}

// sent reports whether the lead went out: a savepoint view's handler sent
// a statement, and its writes can be rolled back to its savepoint.
func (t *lazyTx) sent() bool { return t.lead == leadNone && t.err == nil }

// ensure sends the lead alone if it has not gone yet. It fails once the
// transaction ended, and repeats the lead's failure.
func (t *lazyTx) ensure(ctx context.Context) error {
	switch {
	case t.ended:
		return pgx.ErrTxClosed
	case t.err != nil:
		return t.err
	case t.lead == leadNone:
		return nil
	}
	br, err := t.withLead(ctx, "", nil, nil)
	if err != nil {
		return err
	}
	return br.Close()
}

// pending reports whether the lead is still to go, so that the first
// statement can carry it.
func (t *lazyTx) pending() bool { return t.lead != leadNone && t.err == nil && !t.ended }

// withLead sends the lead and, after it, the statement (sql, args) or the
// queries of batch, in one round trip. It returns the results after the
// lead's, or the lead's failure (then remembered).
func (t *lazyTx) withLead(ctx context.Context, sql string, args []any, batch *pgx.Batch) (pgx.BatchResults, error) {
	b := &t.b
	*b = pgx.Batch{}
	if t.lead == leadCompletion {
		c := t.claim
		b.BeginTx(pgx.TxOptions{})
		b.Queue(c.s.sql.completeWith, c.Namespace, c.Key, c.Token, c.Fence, nil)
	} else {
		b.Queue(savepointSQL)
	}
	switch {
	case batch != nil:
		b.QueuedQueries = append(b.QueuedQueries, batch.QueuedQueries...)
	case sql != "":
		b.Queue(sql, args...)
	}
	var br pgx.BatchResults
	if t.lead == leadCompletion {
		var err error
		if br, err = t.begin(ctx, t.claim.s.pool, b); err != nil {
			t.err = err
			return nil, err
		}
	} else {
		br = t.tx.SendBatch(ctx, b)
	}
	if err := t.readLead(br); err != nil {
		_ = br.Close()
		if errors.Is(err, errFenced) {
			err = t.claim.lost(ctx)
		}
		t.err = err
		return nil, err
	}
	t.lead = leadNone
	return br, nil
}

// readLead reads the lead's results from br.
func (t *lazyTx) readLead(br pgx.BatchResults) error {
	if t.lead == leadSavepoint {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("inbox: savepoint: %w", err)
		}
		return nil
	}
	_, err := br.Exec() // BEGIN
	var done pgconn.CommandTag
	if err == nil {
		done, err = br.Exec()
	}
	switch {
	case err != nil:
		return infraError(ReasonDBConnection, fmt.Errorf("inbox: complete: %w", err))
	case done.RowsAffected() == 0:
		return errFenced
	}
	return nil
}

// batchable reports whether a statement with args can travel in a
// pgx.Batch, which takes no pgx option but a QueryRewriter (pgx.NamedArgs).
func batchable(args []any) bool {
	for _, a := range args {
		switch a.(type) {
		case pgx.QueryRewriter:
			continue
		case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			return false
		}
		return true
	}
	return true
}

// Exec runs sql; the first one carries the lead in its round trip.
func (t *lazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if !t.pending() || !batchable(args) {
		if err := t.ensure(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		return t.tx.Exec(ctx, sql, args...)
	}
	br, err := t.withLead(ctx, sql, args, nil)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// SendBatch sends b; a savepoint view's first one carries the savepoint in
// its round trip, ahead of b's queries (its result is read here, so the
// caller reads b's results only). A completion's verdict is read from its
// row count, so the statements after it run even when it finds the claim
// gone: b, whose callbacks would read their results, goes after it.
func (t *lazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if !t.pending() || t.lead != leadSavepoint || b == nil || b.Len() == 0 {
		if err := t.ensure(ctx); err != nil {
			return pgx.FailedBatchResults(b, err)
		}
		return t.tx.SendBatch(ctx, b)
	}
	br, err := t.withLead(ctx, "", nil, b)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return br
}

// Query runs sql after the lead.
func (t *lazyTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.ensure(ctx); err != nil {
		return errRows{err}, err
	}
	return t.tx.Query(ctx, sql, args...)
}

// QueryRow runs sql after the lead.
func (t *lazyTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.ensure(ctx); err != nil {
		return errRows{err}
	}
	return t.tx.QueryRow(ctx, sql, args...)
}

// ensureNoCtx is ensure for the calls without a context, bounded by the
// default cleanup timeout. Their statements bypass the wrapper, so the
// lead goes first; if it fails, so does every later statement of the
// aborted transaction.
func (t *lazyTx) ensureNoCtx() error {
	ctx, cancel := context.WithTimeout(context.Background(), defaultCleanupTimeout)
	defer cancel()
	return t.ensure(ctx)
}

// Begin starts a savepoint of the handler's own after the lead.
func (t *lazyTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.ensure(ctx); err != nil {
		return nil, err
	}
	return t.tx.Begin(ctx)
}

// CopyFrom copies after the lead.
func (t *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.ensure(ctx); err != nil {
		return 0, err
	}
	return t.tx.CopyFrom(ctx, table, columns, src)
}

// Prepare prepares after the lead.
func (t *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.ensure(ctx); err != nil {
		return nil, err
	}
	return t.tx.Prepare(ctx, name, sql)
}

// LargeObjects sends the lead first; the zero value it returns on failure
// fails on use.
func (t *lazyTx) LargeObjects() pgx.LargeObjects {
	if t.ensureNoCtx() != nil {
		return pgx.LargeObjects{}
	}
	return t.tx.LargeObjects()
}

// Conn sends the lead first; nil on failure.
func (t *lazyTx) Conn() *pgx.Conn {
	if t.ensureNoCtx() != nil {
		return nil
	}
	return t.tx.Conn()
}

// Commit refuses: the inbox commits.
func (t *lazyTx) Commit(context.Context) error { return errHandlerEndsTx }

// Rollback refuses: return an error from the handler instead.
func (t *lazyTx) Rollback(context.Context) error { return errHandlerEndsTx }

// rollback ends the inbox's own transaction, if it is still open, and
// releases its connection (a connection left in a transaction by a failure
// is destroyed by the pool). It is safe to call after commitResults.
func (t *lazyTx) rollback(ctx context.Context) {
	if t.conn != nil {
		_ = t.tx.Rollback(ctx)
	}
	t.end()
}

func (t *lazyTx) end() {
	t.ended = true
	if t.conn != nil {
		t.conn.Release()
		t.conn = nil
	}
}

// commitResults writes the results the units' handlers left (unit.pending)
// and commits t, in one round trip; without results it is a plain COMMIT.
// It ends t. A failure is a failed COMMIT's (ReasonDBCommit): the writes
// may or may not have committed, and the callers rerun the deliveries,
// which are then duplicates if they did.
func (s *Store) commitResults(ctx context.Context, t *lazyTx, units []*unit) error {
	if t.ended || t.conn == nil {
		return infraError(ReasonDBCommit, fmt.Errorf("inbox: commit: %w", pgx.ErrTxClosed))
	}
	defer t.end()
	var consumers, keys, results []string
	for _, u := range units {
		if u.pending != nil && u.err == nil { // a failed handler's writes rolled back to its savepoint
			consumers, keys, results = append(consumers, u.namespace), append(keys, u.key), append(results, string(u.pending))
		}
	}
	if len(results) == 0 {
		if err := t.tx.Commit(ctx); err != nil {
			return infraError(ReasonDBCommit, fmt.Errorf("inbox: commit: %w", err))
		}
		return nil
	}
	b := &pgx.Batch{}
	if len(results) == 1 {
		b.Queue(s.sql.setResult, consumers[0], keys[0], results[0])
	} else {
		b.Queue(s.sql.setResults, consumers, keys, results)
	}
	b.Queue("commit")
	br := t.tx.SendBatch(ctx, b)
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

// errRows is the pgx.Rows and pgx.Row of a Query or QueryRow whose lead
// failed: it holds no row and reports err.
type errRows struct{ err error }

func (errRows) Close()                                       {}
func (r errRows) Err() error                                 { return r.err }
func (errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (errRows) Next() bool                                   { return false }
func (r errRows) Scan(...any) error                          { return r.err }
func (r errRows) Values() ([]any, error)                     { return nil, r.err }
func (errRows) RawValues() [][]byte                          { return nil }
func (errRows) Conn() *pgx.Conn                              { return nil }
func (errRows) TypeMap() *pgtype.Map                         { return nil }
