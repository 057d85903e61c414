package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// fillStats is the time of each phase of one fill.
type fillStats struct {
	rows                           int64
	insert, vacuum, index, analyze time.Duration
}

func (s fillStats) total() time.Duration { return s.insert + s.vacuum + s.index + s.analyze }

// fillSQL inserts the rows $1..$2 of consumer 'bench' (key md5(n), 32
// characters), completed at a random time in the 7 days before $3.
func (t *table) fillSQL() string {
	cols, vals := "", ""
	if t.part != nil {
		cols = ", bucket"
		vals = fmt.Sprintf(", date_bin(%d * interval '1 second', x.ts, '%s')",
			int64(t.part.Width/time.Second), t.part.Origin.Format(time.RFC3339))
	}
	return `INSERT INTO inboxmq_inbox (consumer, key, status, fingerprint, fence, attempts, message_id, completed_at, first_seen_at, updated_at` + cols + `)
SELECT 'bench', md5(g::text), 'completed', sha256('{}'::bytea), 1, 1, 'm-' || g, x.ts, x.ts, x.ts` + vals + `
FROM generate_series($1::bigint, $2::bigint) g,
	LATERAL (SELECT $3::timestamptz - interval '7 days' * random() + interval '0' * g AS ts) x`
}

// indexDDL is what fill drops before it inserts and builds again after.
type indexDDL struct {
	name       string // quoted
	constraint string // the constraint's definition (PRIMARY KEY (…)), or ""
	index      string // CREATE INDEX …, for an index that backs no constraint
}

// fill brings t to size rows the cheapest way that leaves the table as
// normal inserts would: it drops the table's primary key and the indexes
// the rows enter (see tableIndexes; on the partitioned table the parent's,
// which drops the partitions'), inserts the generated rows in chunks over
// -fill-conns connections at once (INSERT … SELECT generate_series),
// VACUUMs the bare heap (hint bits, visibility map, free space map: one
// pass over it), builds the key and the indexes again under their names
// with maintenance_work_mem raised for the session (a sort per index
// instead of one random B-tree descent per row; the key as full as random
// inserts leave it, see keyFill), and ANALYZEs. Row n has the key md5(n)
// whichever fill inserted it, so the claims' copies can name any row.
func (t *table) fill(ctx context.Context, size int64, o options) (fillStats, error) {
	if size <= t.rows {
		return fillStats{}, nil
	}
	now, q := time.Now(), t.fillSQL()
	st, err := t.bulkLoad(ctx, t.rows+1, size, o, func(ctx context.Context, lo, hi int64) error {
		_, err := t.pool.Exec(ctx, q, lo, hi, now)
		return err
	})
	if err != nil {
		return st, err
	}
	t.rows = size
	return st, nil
}

// bulkLoad inserts the rows lo..hi, insert(lo', hi') inserting a chunk of
// them, the way fill describes.
func (t *table) bulkLoad(ctx context.Context, lo, hi int64, o options, insert func(ctx context.Context, lo, hi int64) error) (fillStats, error) {
	st := fillStats{rows: hi - lo + 1}
	conn, err := t.pool.Acquire(ctx)
	if err != nil {
		return st, err
	}
	defer conn.Release()
	ddl, err := tableIndexes(ctx, conn.Conn())
	if err != nil {
		return st, fmt.Errorf("fill %s: %w", t.name, err)
	}
	for _, d := range ddl {
		drop := "DROP INDEX " + d.name
		if d.constraint != "" {
			drop = "ALTER TABLE inboxmq_inbox DROP CONSTRAINT " + d.name
		}
		if _, err := conn.Exec(ctx, drop); err != nil {
			return st, fmt.Errorf("fill %s: %w", t.name, err)
		}
	}

	began := time.Now()
	if err := t.insertChunks(ctx, lo, hi, o, insert); err != nil {
		return st, err
	}
	st.insert = time.Since(began)

	began = time.Now()
	if _, err := conn.Exec(ctx, "VACUUM inboxmq_inbox"); err != nil {
		return st, fmt.Errorf("fill %s: vacuum: %w", t.name, err)
	}
	st.vacuum = time.Since(began)

	began = time.Now()
	if _, err := conn.Exec(ctx, "SELECT set_config('maintenance_work_mem', $1, false)", o.maintMem); err != nil {
		return st, fmt.Errorf("fill %s: %w", t.name, err)
	}
	for _, d := range ddl {
		// pg_get_indexdef says ON ONLY for a partitioned table's index:
		// built so, it would cover no partition.
		build := []string{strings.Replace(d.index, " ON ONLY ", " ON ", 1)}
		switch {
		case strings.HasPrefix(d.constraint, "PRIMARY KEY"):
			if build, err = keyDDL(ctx, conn.Conn(), d); err != nil {
				return st, fmt.Errorf("fill %s: %w", t.name, err)
			}
		case d.constraint != "":
			build = []string{"ALTER TABLE inboxmq_inbox ADD CONSTRAINT " + d.name + " " + d.constraint}
		}
		for _, b := range build {
			if _, err := conn.Exec(ctx, b); err != nil {
				return st, fmt.Errorf("fill %s: %s: %w", t.name, b, err)
			}
		}
	}
	if _, err := conn.Exec(ctx, "RESET maintenance_work_mem"); err != nil {
		return st, fmt.Errorf("fill %s: %w", t.name, err)
	}
	st.index = time.Since(began)

	began = time.Now()
	if _, err := conn.Exec(ctx, "ANALYZE inboxmq_inbox"); err != nil {
		return st, fmt.Errorf("fill %s: analyze: %w", t.name, err)
	}
	st.analyze = time.Since(began)
	return st, nil
}

// keyFill is the fill factor the primary key is built with. Its keys are
// random (idempotency keys: hashes, UUIDs), and a B-tree grown by inserts
// of random keys settles at about 70 % full (ln 2 ≈ 69 %: every split
// leaves two half-full pages), where one built by a sort is 90 % full, a
// quarter smaller than the real one. The index on completed_at keeps the
// default 90 %: a real table appends to it in time order, and rightmost
// splits leave pages as full as a sorted build does.
const keyFill = 70

// keyDDL builds the primary key d at keyFill then resets its fill factor,
// so that later splits behave as on any table. On the partitioned table
// it builds each partition's key (under the name PostgreSQL would give
// it), resets it, then adds the parent's, which attaches them: a
// partitioned index's fill factor cannot be reset, and new partitions
// would inherit it.
func keyDDL(ctx context.Context, conn *pgx.Conn, d indexDDL) ([]string, error) {
	build := func(table, key string) []string {
		return []string{
			fmt.Sprintf("ALTER TABLE %s ADD CONSTRAINT %s %s WITH (fillfactor = %d)", table, key, d.constraint, keyFill),
			"ALTER INDEX " + key + " RESET (fillfactor)",
		}
	}
	rows, err := conn.Query(ctx, `SELECT c.relname FROM pg_partition_tree('inboxmq_inbox') p
		JOIN pg_class c ON c.oid = p.relid WHERE p.isleaf ORDER BY c.relname`)
	if err != nil {
		return nil, err
	}
	leaves, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	if len(leaves) == 0 { // not partitioned
		return build("inboxmq_inbox", d.name), nil
	}
	var ddl []string
	for _, l := range leaves {
		ddl = append(ddl, build(pgx.Identifier{l}.Sanitize(), pgx.Identifier{l + "_pkey"}.Sanitize())...)
	}
	return append(ddl, "ALTER TABLE inboxmq_inbox ADD CONSTRAINT "+d.name+" "+d.constraint), nil
}

// tableIndexes lists the indexes of inboxmq_inbox (the parent's, on the
// partitioned table) that a fill must build again, the ones that back a
// constraint first, so that a build in this order makes the key before the
// other indexes. A partial index whose predicate is false for a completed
// row (the reconciler's on processing rows, the partitioned table's on rows
// not completed) gains no entry from a fill, so it stays in place: built
// again, it would only cost one more pass over the heap.
func tableIndexes(ctx context.Context, conn *pgx.Conn) ([]indexDDL, error) {
	rows, err := conn.Query(ctx, `SELECT quote_ident(ic.relname), COALESCE(pg_get_constraintdef(c.oid), ''),
		CASE WHEN c.oid IS NULL THEN pg_get_indexdef(i.indexrelid) ELSE '' END,
		COALESCE(pg_get_expr(i.indpred, i.indrelid), '')
		FROM pg_index i
		JOIN pg_class ic ON ic.oid = i.indexrelid
		LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid
		WHERE i.indrelid = 'inboxmq_inbox'::regclass
		ORDER BY c.oid IS NULL, ic.relname`)
	if err != nil {
		return nil, err
	}
	type index struct {
		indexDDL
		pred string
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (index, error) {
		var d index
		err := r.Scan(&d.name, &d.constraint, &d.index, &d.pred)
		return d, err
	})
	if err != nil {
		return nil, err
	}
	var ddl []indexDDL
	for _, d := range all {
		if d.pred != "" && d.constraint == "" {
			// A predicate on other columns than status fails here: then
			// the index is built again like any other.
			var none bool
			err := conn.QueryRow(ctx, `SELECT NOT EXISTS (SELECT FROM (SELECT 'completed'::text AS status) inboxmq_inbox WHERE `+d.pred+`)`).Scan(&none)
			if err == nil && none {
				continue
			}
		}
		ddl = append(ddl, d.indexDDL)
	}
	return ddl, nil
}

// insertChunks inserts the rows lo..hi in chunks of o.chunk, o.fillConns
// chunks at a time.
func (t *table) insertChunks(ctx context.Context, lo, hi int64, o options, insert func(ctx context.Context, lo, hi int64) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan [2]int64)
	go func() {
		defer close(next)
		for a := lo; a <= hi; a += o.chunk {
			select {
			case next <- [2]int64{a, min(a+o.chunk-1, hi)}:
			case <-ctx.Done():
				return
			}
		}
	}()
	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	for range max(o.fillConns, 1) {
		wg.Go(func() {
			for c := range next {
				if err := insert(ctx, c[0], c[1]); err != nil {
					once.Do(func() { firstErr = fmt.Errorf("fill %s: rows %d..%d: %w", t.name, c[0], c[1], err) })
					cancel()
					return
				}
			}
		})
	}
	wg.Wait()
	return firstErr
}

// reset empties t (TRUNCATE: the disk is given back at once).
func (t *table) reset(ctx context.Context) error {
	if _, err := t.pool.Exec(ctx, "TRUNCATE inboxmq_inbox"); err != nil {
		return fmt.Errorf("truncate %s: %w", t.name, err)
	}
	t.rows = 0
	return nil
}
