package inbox

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Pipelined group commit (GroupCommit.Pipeline): the handlers of a batch run
// concurrently on the batch's transaction, and their statements travel
// together. Each round trip carries the next Exec of every handler still
// running, so a batch of 64 handlers with two inserts each costs two round
// trips instead of 128 — the same as a hand-written batched loop.
//
// It is optimistic: there are no savepoints, so a statement that fails, a
// handler that returns an error or calls anything but Exec aborts the
// attempt; the transaction is rolled back and the batch runs again in the
// serial savepoint mode, where each delivery is classified alone.

// pipelineStall bounds how long the collector waits for a handler that is
// neither in Exec nor finished before it aborts the pipelined attempt.
const pipelineStall = 20 * time.Millisecond

// errNotPipelined is what a pipelined handler gets for any call but Exec.
var errNotPipelined = errors.New("inbox: pipelined group commit supports only Exec; the batch runs again with savepoints")

// errPipelineAborted is what a pipelined handler gets once the attempt has
// failed.
var errPipelineAborted = errors.New("inbox: pipelined group commit aborted; the batch runs again with savepoints")

type pipeReq struct {
	sql  string
	args []any
	res  chan pipeRes
}

type pipeRes struct {
	tag pgconn.CommandTag
	err error
}

// pipeline collects the handlers' statements of one batch attempt.
type pipeline struct {
	reqs    chan *pipeReq
	done    chan struct{}
	aborted atomic.Bool
}

// runPipelined runs the claimed units' handlers concurrently on tx. It
// reports whether every handler and every statement succeeded; if not, tx
// is unusable and must be rolled back.
func (s *Store) runPipelined(ctx context.Context, tx pgx.Tx, claimed []claimedUnit) bool {
	n := len(claimed)
	p := &pipeline{reqs: make(chan *pipeReq, n), done: make(chan struct{}, n)}
	errs := make([]error, n)
	for i, cu := range claimed {
		u := cu.u
		u.fence = cu.fence
		go func() {
			errs[i] = s.runHandler(u, &pipeTx{p: p})
			p.done <- struct{}{}
		}()
	}
	active := n
	pending := make([]*pipeReq, 0, n)
	stall := time.NewTimer(pipelineStall)
	defer stall.Stop()
	for active > 0 {
		// Wait until every running handler is blocked on a statement (or
		// finished), then send all their statements in one round trip. A
		// handler that neither sends a statement nor finishes within
		// pipelineStall may be waiting on another handler (a shared mutex,
		// a semaphore): the attempt is aborted, so nothing waits forever,
		// and the batch runs serially.
		for len(pending) < active {
			stall.Reset(pipelineStall)
			select {
			case r := <-p.reqs:
				pending = append(pending, r)
			case <-p.done:
				active--
			case <-stall.C:
				p.aborted.Store(true)
				if len(pending) > 0 {
					p.flush(ctx, tx, pending)
					pending = pending[:0]
				}
			}
		}
		if len(pending) == 0 {
			break
		}
		p.flush(ctx, tx, pending)
		pending = pending[:0]
	}
	if p.aborted.Load() {
		return false
	}
	for _, err := range errs {
		if err != nil {
			return false
		}
	}
	return true
}

// flush sends pending statements as one pipeline and hands each its result.
func (p *pipeline) flush(ctx context.Context, tx pgx.Tx, pending []*pipeReq) {
	if p.aborted.Load() {
		for _, r := range pending {
			r.res <- pipeRes{err: errPipelineAborted}
		}
		return
	}
	b := &pgx.Batch{}
	for _, r := range pending {
		b.Queue(r.sql, r.args...)
	}
	br := tx.SendBatch(ctx, b)
	for _, r := range pending {
		tag, err := br.Exec()
		if err != nil {
			p.aborted.Store(true)
		}
		r.res <- pipeRes{tag: tag, err: err}
	}
	if err := br.Close(); err != nil {
		p.aborted.Store(true)
	}
}

func (p *pipeline) exec(sql string, args []any) (pgconn.CommandTag, error) {
	if p.aborted.Load() {
		return pgconn.CommandTag{}, errPipelineAborted
	}
	if len(args) > 0 {
		if _, mode := args[0].(pgx.QueryExecMode); mode {
			return pgconn.CommandTag{}, p.refuse()
		}
	}
	r := &pipeReq{sql: sql, args: args, res: make(chan pipeRes, 1)}
	p.reqs <- r
	res := <-r.res
	return res.tag, res.err
}

func (p *pipeline) refuse() error {
	p.aborted.Store(true)
	return errNotPipelined
}

// pipeTx is the transaction a pipelined handler sees. Only Exec goes
// through; every other call aborts the attempt (the handler must not touch
// the shared connection directly).
type pipeTx struct {
	p *pipeline
}

var _ pgx.Tx = (*pipeTx)(nil)

// Exec queues sql for the batch's next round trip and waits for its result.
func (t *pipeTx) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.p.exec(sql, args)
}

// Begin aborts the attempt.
func (t *pipeTx) Begin(context.Context) (pgx.Tx, error) { return nil, t.p.refuse() }

// Commit aborts the attempt (the batch commits, not its handlers).
func (t *pipeTx) Commit(context.Context) error { return t.p.refuse() }

// Rollback aborts the attempt.
func (t *pipeTx) Rollback(context.Context) error { return t.p.refuse() }

// CopyFrom aborts the attempt.
func (t *pipeTx) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, t.p.refuse()
}

// SendBatch aborts the attempt.
func (t *pipeTx) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults {
	return errBatch{t.p.refuse()}
}

// LargeObjects aborts the attempt; the zero value it returns fails on use.
func (t *pipeTx) LargeObjects() pgx.LargeObjects {
	_ = t.p.refuse()
	return pgx.LargeObjects{}
}

// Prepare aborts the attempt.
func (t *pipeTx) Prepare(context.Context, string, string) (*pgconn.StatementDescription, error) {
	return nil, t.p.refuse()
}

// Query aborts the attempt.
func (t *pipeTx) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, t.p.refuse()
}

// QueryRow aborts the attempt.
func (t *pipeTx) QueryRow(context.Context, string, ...any) pgx.Row {
	return errRow{t.p.refuse()}
}

// Conn aborts the attempt and returns nil: the shared connection is not
// the handler's to use.
func (t *pipeTx) Conn() *pgx.Conn {
	_ = t.p.refuse()
	return nil
}
