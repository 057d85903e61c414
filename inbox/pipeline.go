package inbox

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Pipelined group commit (GroupCommit.Pipeline): the handlers of a batch run
// concurrently on the batch's transaction, and their statements travel
// together. Each round trip carries the next Exec of every handler still
// running, so a batch of 64 handlers with two inserts each costs two round
// trips instead of 128 — the same as a hand-written batched loop.
//
// Exec, Query, QueryRow and SendBatch all travel that way (a batch's
// statements back to back in one round trip; rows are read in full, see
// pipeline_rows.go). It is optimistic: there are no savepoints, so a
// statement that fails, a handler that returns an error or calls anything
// else (Begin, CopyFrom, Conn, …) aborts the attempt; the transaction is rolled back and the batch runs again in the
// serial savepoint mode, where each delivery is classified alone.

// pipelineStall bounds how long the collector waits for a handler that is
// neither in Exec nor finished before it aborts the pipelined attempt.
const pipelineStall = 20 * time.Millisecond

// errNotPipelined is what a pipelined handler gets for a call the pipeline
// cannot carry.
var errNotPipelined = errors.New("inbox: pipelined group commit supports Exec, Query, QueryRow and SendBatch only; the batch runs again with savepoints")

// errPipelineAborted is what a pipelined handler gets once the attempt has
// failed.
var errPipelineAborted = errors.New("inbox: pipelined group commit aborted; the batch runs again with savepoints")

// pipeReq is one call of a handler: a statement (sql, args), or a batch of
// them (batch); rows says whether its results are read in full.
type pipeReq struct {
	sql   string
	args  []any
	batch *pgx.Batch
	rows  bool
	res   chan pipeRes
}

type pipeRes struct {
	tag     pgconn.CommandTag
	results []bufResult // rows or batch: a result per statement
	typeMap *pgtype.Map
	err     error
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
		if r.batch != nil {
			for _, qq := range r.batch.QueuedQueries {
				b.Queue(qq.SQL, qq.Arguments...)
			}
			continue
		}
		b.Queue(r.sql, r.args...)
	}
	br := tx.SendBatch(ctx, b)
	typeMap := tx.Conn().TypeMap()
	for _, r := range pending {
		var res pipeRes
		switch {
		case r.batch != nil:
			res.results = make([]bufResult, len(r.batch.QueuedQueries))
			for i := range res.results {
				res.results[i] = readResult(br)
				if res.err == nil {
					res.err = res.results[i].err
				}
			}
		case r.rows:
			res.results = []bufResult{readResult(br)}
			res.err = res.results[0].err
		default:
			res.tag, res.err = br.Exec()
		}
		if res.err != nil {
			p.aborted.Store(true)
		}
		res.typeMap = typeMap
		r.res <- res
	}
	if err := br.Close(); err != nil {
		p.aborted.Store(true)
	}
}

func (p *pipeline) exec(sql string, args []any) (pgconn.CommandTag, error) {
	res := p.send(&pipeReq{sql: sql, args: args})
	return res.tag, res.err
}

// send queues r for the batch's next round trip and waits for its result.
// Arguments that change how pgx runs a statement (a QueryExecMode, a
// QueryRewriter…) cannot ride in the shared batch: the attempt aborts.
func (p *pipeline) send(r *pipeReq) pipeRes {
	if p.aborted.Load() {
		return pipeRes{err: errPipelineAborted}
	}
	check := [][]any{r.args}
	if r.batch != nil {
		check = check[:0]
		for _, qq := range r.batch.QueuedQueries {
			check = append(check, qq.Arguments)
		}
	}
	for _, args := range check {
		if len(args) == 0 {
			continue
		}
		switch args[0].(type) {
		case pgx.QueryExecMode, pgx.QueryRewriter, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			return pipeRes{err: p.refuse()}
		}
	}
	r.res = make(chan pipeRes, 1)
	p.reqs <- r
	return <-r.res
}

func (p *pipeline) refuse() error {
	p.aborted.Store(true)
	return errNotPipelined
}

// pipeTx is the transaction a pipelined handler sees. Exec, Query,
// QueryRow and SendBatch go through; every other call aborts the attempt
// (the handler must not touch the shared connection directly).
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

// SendBatch queues b's statements, back to back, for the batch's next
// round trip and waits for their results.
func (t *pipeTx) SendBatch(_ context.Context, b *pgx.Batch) pgx.BatchResults {
	if b.Len() == 0 {
		return &bufBatch{b: b}
	}
	res := t.p.send(&pipeReq{batch: b})
	if res.results == nil {
		return errBatch{res.err}
	}
	return &bufBatch{b: b, results: res.results, typeMap: res.typeMap}
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

// Query queues sql for the batch's next round trip and returns its rows,
// read in full.
func (t *pipeTx) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows := t.query(sql, args)
	return rows, rows.err
}

func (t *pipeTx) query(sql string, args []any) *bufRows {
	res := t.p.send(&pipeReq{sql: sql, args: args, rows: true})
	if res.err != nil {
		return &bufRows{err: res.err}
	}
	return &bufRows{r: res.results[0], typeMap: res.typeMap, idx: -1}
}

// QueryRow queues sql for the batch's next round trip and returns its
// first row.
func (t *pipeTx) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	return (*bufRow)(t.query(sql, args))
}

// Conn aborts the attempt and returns nil: the shared connection is not
// the handler's to use.
func (t *pipeTx) Conn() *pgx.Conn {
	_ = t.p.refuse()
	return nil
}
