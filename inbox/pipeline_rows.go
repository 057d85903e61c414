package inbox

import (
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// A pipelined handler's SendBatch, Query and QueryRow: their statements
// travel in the batch's next round trip like an Exec's, and their results
// are read there in full (the round trip must be read to its end before
// the next), kept in memory and handed to the handler afterwards. Handlers
// of a group commit write a few rows each; a statement returning many rows
// is better left to the serial savepoint mode (no Pipeline).

// bufResult is one statement's result, read in full.
type bufResult struct {
	fields []pgconn.FieldDescription
	rows   [][][]byte
	tag    pgconn.CommandTag
	err    error
}

// readResult reads the next result of br in full.
func readResult(br pgx.BatchResults) bufResult {
	rows, err := br.Query()
	if err != nil {
		return bufResult{err: err}
	}
	var r bufResult
	for rows.Next() {
		raw := rows.RawValues()
		row := make([][]byte, len(raw))
		for i, v := range raw {
			if v != nil {
				row[i] = append(make([]byte, 0, len(v)), v...)
			}
		}
		r.rows = append(r.rows, row)
	}
	r.fields = append([]pgconn.FieldDescription(nil), rows.FieldDescriptions()...)
	rows.Close()
	r.tag, r.err = rows.CommandTag(), rows.Err()
	return r
}

// bufBatch is the pgx.BatchResults of a pipelined handler's SendBatch.
type bufBatch struct {
	b       *pgx.Batch
	results []bufResult
	typeMap *pgtype.Map
	next    int
	err     error // an error of the attempt or of a QueuedQuery's callback
	closed  bool
}

func (bb *bufBatch) take() (bufResult, error) {
	if bb.err != nil {
		return bufResult{}, bb.err
	}
	if bb.closed || bb.next >= len(bb.results) {
		return bufResult{}, errors.New("inbox: no more results in the batch")
	}
	r := bb.results[bb.next]
	bb.next++
	return r, r.err
}

// Exec returns the next statement's command tag.
func (bb *bufBatch) Exec() (pgconn.CommandTag, error) {
	r, err := bb.take()
	return r.tag, err
}

// Query returns the next statement's rows.
func (bb *bufBatch) Query() (pgx.Rows, error) {
	rows := bb.query()
	return rows, rows.err
}

func (bb *bufBatch) query() *bufRows {
	r, err := bb.take()
	if err != nil {
		return &bufRows{err: err, typeMap: bb.typeMap}
	}
	return &bufRows{r: r, typeMap: bb.typeMap, idx: -1}
}

// QueryRow returns the next statement's first row.
func (bb *bufBatch) QueryRow() pgx.Row { return (*bufRow)(bb.query()) }

// Close runs the callbacks of the statements not read yet, as pgx does.
func (bb *bufBatch) Close() error {
	if bb.closed {
		return bb.err
	}
	for bb.err == nil && bb.next < len(bb.results) {
		qq := bb.b.QueuedQueries[bb.next]
		if qq.Fn != nil {
			if err := qq.Fn(bb); err != nil {
				bb.err = err
			}
		} else if _, err := bb.Exec(); err != nil {
			bb.err = err
		}
	}
	bb.closed = true
	return bb.err
}

// Tx returns nil: a handler's batch begins no transaction.
func (bb *bufBatch) Tx() pgx.Tx { return nil }

// bufRows is a pgx.Rows over a result read in full.
type bufRows struct {
	r       bufResult
	typeMap *pgtype.Map
	idx     int
	err     error
	closed  bool
}

func (rs *bufRows) Close()                                       { rs.closed = true }
func (rs *bufRows) Err() error                                   { return rs.err }
func (rs *bufRows) CommandTag() pgconn.CommandTag                { return rs.r.tag }
func (rs *bufRows) FieldDescriptions() []pgconn.FieldDescription { return rs.r.fields }
func (rs *bufRows) Conn() *pgx.Conn                              { return nil }
func (rs *bufRows) TypeMap() *pgtype.Map                         { return rs.typeMap }

func (rs *bufRows) Next() bool {
	if rs.closed || rs.err != nil || rs.idx+1 >= len(rs.r.rows) {
		rs.closed = true
		return false
	}
	rs.idx++
	return true
}

func (rs *bufRows) Scan(dest ...any) error {
	if rs.idx < 0 || rs.idx >= len(rs.r.rows) {
		return errors.New("inbox: Scan called without a row")
	}
	if err := pgx.ScanRow(rs.typeMap, rs.r.fields, rs.r.rows[rs.idx], dest...); err != nil {
		rs.err = err
		return err
	}
	return nil
}

func (rs *bufRows) Values() ([]any, error) {
	if rs.idx < 0 || rs.idx >= len(rs.r.rows) {
		return nil, errors.New("inbox: Values called without a row")
	}
	raw := rs.r.rows[rs.idx]
	vals := make([]any, len(raw))
	for i, v := range raw {
		if v == nil {
			continue
		}
		f := rs.r.fields[i]
		dt, ok := rs.typeMap.TypeForOID(f.DataTypeOID)
		if !ok {
			vals[i] = append([]byte(nil), v...)
			continue
		}
		val, err := dt.Codec.DecodeValue(rs.typeMap, f.DataTypeOID, f.Format, v)
		if err != nil {
			return nil, err
		}
		vals[i] = val
	}
	return vals, nil
}

func (rs *bufRows) RawValues() [][]byte {
	if rs.idx < 0 || rs.idx >= len(rs.r.rows) {
		return nil
	}
	return rs.r.rows[rs.idx]
}

// bufRow is the pgx.Row of QueryRow: the first row, or pgx.ErrNoRows.
type bufRow bufRows

func (r *bufRow) Scan(dest ...any) error {
	rs := (*bufRows)(r)
	if rs.err != nil {
		return rs.err
	}
	if !rs.Next() {
		return pgx.ErrNoRows
	}
	err := rs.Scan(dest...)
	rs.Close()
	return err
}
