package migrations

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The partitioned inbox (opt-in; docs/scaling.md, "The inbox table").
//
// PartitionInbox turns the inbox table into a table partitioned by range on
// a bucket column (the start of a time bucket of PartitionConfig.Width), so
// that retention drops whole partitions instead of deleting rows. The
// primary key becomes (consumer, key, bucket); what keeps one row per
// (consumer, key) across partitions is the bucket function
// (<table>_bucket(consumer, key)) that every inserting statement of package
// inbox calls: it takes a transaction-scoped advisory lock on the key, then
// returns the bucket of the key's existing row, in whatever partition, or
// the current bucket for a new key. The lock serialises two claims of one
// key even when they fall on either side of a bucket boundary, and the
// function's own fresh snapshot (it is VOLATILE) sees a row that the other
// claim committed while this one waited.

// PartitionConfig configures [PartitionInbox]. A nil *PartitionConfig means
// the defaults.
type PartitionConfig struct {
	// Table is the inbox table, optionally schema-qualified. Defaults to
	// "inboxmq_inbox", resolved through the search_path.
	Table string
	// Width is the time span of one partition, a whole number of seconds of
	// at least one second. Retention drops a partition once its whole span
	// is older than the retention window, so a completed row is kept
	// between the window and the window plus Width. Defaults to 24 hours.
	Width time.Duration
	// Ahead is how many partitions past the current one exist at any time;
	// inbox.Retention creates the missing ones on each run. Defaults to 3.
	Ahead int
	// DropOld drops the unpartitioned table after its rows were copied.
	// Defaults to false: it is renamed <table>_unpartitioned and left for
	// the operator to drop.
	DropOld bool
}

// Partitioning describes a partitioned inbox table.
type Partitioning struct {
	// Table is the inbox table's name, schema-qualified and quoted.
	Table string
	// Width is the span of one partition; Origin is a bucket boundary.
	Width  time.Duration
	Origin time.Time
	// Ahead is how many partitions past the current one are kept ready.
	Ahead int
	// Func is the bucket function's name, schema-qualified and quoted.
	Func string

	schema, name string
}

// Bucket returns the start of the bucket holding t.
func (p *Partitioning) Bucket(t time.Time) time.Time {
	d := t.Sub(p.Origin)
	n := d / p.Width
	if d < 0 && d%p.Width != 0 {
		n--
	}
	return p.Origin.Add(n * p.Width)
}

// PartitionName returns the name (schema-qualified, quoted) of the
// partition whose bucket starts at start.
func (p *Partitioning) PartitionName(start time.Time) string {
	return pgx.Identifier{p.schema, p.name + "_p" + start.UTC().Format("20060102t150405")}.Sanitize()
}

// metaTable records the partitioned inbox tables and their bucket width.
const metaTable = `CREATE TABLE IF NOT EXISTS inboxmq_partitioning (
	table_name regclass    PRIMARY KEY,
	width_us   bigint      NOT NULL CHECK (width_us > 0),
	origin     timestamptz NOT NULL,
	ahead      integer     NOT NULL CHECK (ahead >= 0)
)`

var (
	identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)
	// maxBaseLen leaves room for the partition suffix _pYYYYMMDDtHHMMSS.
	maxBaseLen = 63 - len("_p20060102t150405")
)

// ErrNotPartitioned is returned by [LoadPartitioning] for a table that is
// not a partitioned inbox.
var ErrNotPartitioned = errors.New("migrations: the inbox table is not partitioned")

func splitTable(table string) (schema, name string, err error) {
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return "", "", fmt.Errorf("migrations: invalid table name %q", table)
	}
	for _, p := range parts {
		if !identRE.MatchString(p) {
			return "", "", fmt.Errorf("migrations: invalid table name %q", table)
		}
	}
	if len(parts) == 2 {
		return parts[0], parts[1], nil
	}
	return "", parts[0], nil
}

// LoadPartitioning returns the partitioning of table (as in
// PartitionConfig.Table; "" is the default table), or an error wrapping
// [ErrNotPartitioned].
func LoadPartitioning(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, table string) (*Partitioning, error) {
	if table == "" {
		table = "inboxmq_inbox"
	}
	schema, name, err := splitTable(table)
	if err != nil {
		return nil, err
	}
	id := pgx.Identifier{name}
	if schema != "" {
		id = pgx.Identifier{schema, name}
	}
	var p Partitioning
	var widthUS int64
	var found bool
	err = db.QueryRow(ctx, `SELECT n.nspname, c.relname,
		to_regclass('inboxmq_partitioning') IS NOT NULL AND EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = c.oid)
	FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	WHERE c.oid = to_regclass($1)`, id.Sanitize()).Scan(&p.schema, &p.name, &found)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("migrations: table %s does not exist", id.Sanitize())
	}
	if err != nil {
		return nil, fmt.Errorf("migrations: partitioning: %w", err)
	}
	p.Table = pgx.Identifier{p.schema, p.name}.Sanitize()
	p.Func = pgx.Identifier{p.schema, p.name + "_bucket"}.Sanitize()
	if !found {
		return nil, fmt.Errorf("%w (table %s)", ErrNotPartitioned, p.Table)
	}
	err = db.QueryRow(ctx, `SELECT width_us, origin, ahead FROM inboxmq_partitioning WHERE table_name = to_regclass($1)`,
		p.Table).Scan(&widthUS, &p.Origin, &p.Ahead)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w (table %s has no row in inboxmq_partitioning)", ErrNotPartitioned, p.Table)
	}
	if err != nil {
		return nil, fmt.Errorf("migrations: partitioning: %w", err)
	}
	p.Width = time.Duration(widthUS) * time.Microsecond
	return &p, nil
}

// origin is the bucket origin of every partitioned inbox.
var origin = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// PartitionInbox makes the inbox table partitioned (see docs/scaling.md):
// it creates the partitioned table, copies the rows of today's table into
// it (a completed row into the bucket of its completed_at, any other into
// the current bucket) and creates the partitions from the oldest row's to
// Ahead past the current one, in one transaction that holds the old table
// locked: stop the workers, or expect them to wait, while it runs. On a
// table that is already partitioned it only creates the missing partitions
// ahead. It is safe to run concurrently (an advisory lock per table
// serialises the runs).
func PartitionInbox(ctx context.Context, pool *pgxpool.Pool, cfg *PartitionConfig) (*Partitioning, error) {
	var c PartitionConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Table == "" {
		c.Table = "inboxmq_inbox"
	}
	if c.Width == 0 {
		c.Width = 24 * time.Hour
	}
	if c.Ahead == 0 {
		c.Ahead = 3
	}
	if c.Width < time.Second || c.Width%time.Second != 0 {
		return nil, fmt.Errorf("migrations: partition width %s: want a whole number of seconds", c.Width)
	}
	if c.Ahead < 0 {
		return nil, fmt.Errorf("migrations: partitions ahead %d: want 0 or more", c.Ahead)
	}
	schema, name, err := splitTable(c.Table)
	if err != nil {
		return nil, err
	}
	if len(name) > maxBaseLen {
		return nil, fmt.Errorf("migrations: table name %q: at most %d characters for a partitioned inbox", name, maxBaseLen)
	}
	id := pgx.Identifier{name}
	if schema != "" {
		id = pgx.Identifier{schema, name}
	}

	var p *Partitioning
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// One conversion at a time per schema (the partitioning table is
		// created in it), then per table.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('inboxmq_partition'), hashtext(current_schema()))`); err != nil {
			return fmt.Errorf("migrations: partition lock: %w", err)
		}
		if _, err := tx.Exec(ctx, metaTable); err != nil {
			return fmt.Errorf("migrations: partitioning table: %w", err)
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('inboxmq_partition'), hashtext($1))`, c.Table); err != nil {
			return fmt.Errorf("migrations: partition lock: %w", err)
		}
		var err error
		p, err = LoadPartitioning(ctx, tx, c.Table)
		if err == nil {
			return nil // already partitioned
		}
		if !errors.Is(err, ErrNotPartitioned) {
			return err
		}
		p, err = convert(ctx, tx, id, c)
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := CreatePartitions(ctx, pool, p, time.Now()); err != nil {
		return nil, err
	}
	return p, nil
}

// convert replaces the unpartitioned table id by a partitioned one.
func convert(ctx context.Context, tx pgx.Tx, id pgx.Identifier, c PartitionConfig) (*Partitioning, error) {
	var schema, name string
	err := tx.QueryRow(ctx, `SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = to_regclass($1)`, id.Sanitize()).Scan(&schema, &name)
	if err != nil {
		return nil, fmt.Errorf("migrations: table %s: %w (run migrations.Up first)", id.Sanitize(), err)
	}
	t := pgx.Identifier{schema, name}.Sanitize()
	old := pgx.Identifier{schema, name + "_unpartitioned"}.Sanitize()
	oldName := pgx.Identifier{name + "_unpartitioned"}.Sanitize()
	fn := pgx.Identifier{schema, name + "_bucket"}.Sanitize()
	bin := fmt.Sprintf(`date_bin(%d * interval '1 second', %%s, '%s')`, int64(c.Width/time.Second), origin.Format(time.RFC3339))

	stmts := []string{
		`LOCK TABLE ` + t + ` IN ACCESS EXCLUSIVE MODE`,
		`ALTER TABLE ` + t + ` RENAME TO ` + oldName,
		// Columns, defaults and the status CHECK come from the old table;
		// PostgreSQL names the indexes (it avoids the old ones' names).
		`CREATE TABLE ` + t + ` (LIKE ` + old + ` INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
	bucket timestamptz NOT NULL DEFAULT ` + fmt.Sprintf(bin, "now()") + `,
	PRIMARY KEY (consumer, key, bucket)) PARTITION BY RANGE (bucket)`,
		// The reconciler's scan: claims past their lease.
		`CREATE INDEX ON ` + t + ` (lease_until) WHERE status = 'processing'`,
		// Retention: the rows of an expiring partition that it must keep
		// (moved to the current bucket before the partition is dropped).
		`CREATE INDEX ON ` + t + ` (completed_at) WHERE status = 'completed'`,
		`CREATE INDEX ON ` + t + ` (status) WHERE status <> 'completed'`,
		// The bucket function: see the package comment in partition.go.
		`CREATE OR REPLACE FUNCTION ` + fn + `(c text, k text) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $f$
DECLARE b timestamptz;
BEGIN
	PERFORM pg_advisory_xact_lock(hashtext(c), hashtext(k));
	SELECT i.bucket INTO b FROM ` + t + ` i WHERE i.consumer = c AND i.key = k LIMIT 1;
	RETURN COALESCE(b, ` + fmt.Sprintf(bin, "now()") + `);
END
$f$`,
	}
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return nil, fmt.Errorf("migrations: partition %s: %w", t, err)
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO inboxmq_partitioning (table_name, width_us, origin, ahead)
		VALUES (to_regclass($1), $2, $3, $4)
		ON CONFLICT (table_name) DO UPDATE SET width_us = EXCLUDED.width_us, origin = EXCLUDED.origin, ahead = EXCLUDED.ahead`,
		t, c.Width.Microseconds(), origin, c.Ahead); err != nil {
		return nil, fmt.Errorf("migrations: partitioning row: %w", err)
	}
	p, err := LoadPartitioning(ctx, tx, schema+"."+name)
	if err != nil {
		return nil, err
	}

	// Partitions for the old rows, then copy them.
	keep := `CASE WHEN status = 'completed' THEN COALESCE(completed_at, now()) ELSE now() END`
	var oldest time.Time
	if err := tx.QueryRow(ctx, `SELECT COALESCE(min(`+keep+`), now()) FROM `+old).Scan(&oldest); err != nil {
		return nil, fmt.Errorf("migrations: partition %s: oldest row: %w", t, err)
	}
	if err := createPartitions(ctx, tx, p, oldest, time.Now()); err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+t+` SELECT o.*, `+fmt.Sprintf(bin, keep)+` FROM `+old+` o`); err != nil {
		return nil, fmt.Errorf("migrations: partition %s: copy rows: %w", t, err)
	}
	if c.DropOld {
		if _, err := tx.Exec(ctx, `DROP TABLE `+old); err != nil {
			return nil, fmt.Errorf("migrations: partition %s: drop old table: %w", t, err)
		}
	}
	return p, nil
}

// maxPartitions bounds the partitions that one call creates.
const maxPartitions = 10000

// CreatePartitions creates the partitions of p that are missing from the
// bucket of from to Ahead buckets past the current one (retention passes
// time.Now()). Each one is created as a plain table and attached, which
// locks the inbox table only in SHARE UPDATE EXCLUSIVE mode (workers keep
// reading and writing).
func CreatePartitions(ctx context.Context, pool *pgxpool.Pool, p *Partitioning, from time.Time) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return createPartitions(ctx, tx, p, from, time.Now())
	})
}

func createPartitions(ctx context.Context, tx pgx.Tx, p *Partitioning, from, now time.Time) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('inboxmq_partition'), hashtext($1))`, p.Table); err != nil {
		return fmt.Errorf("migrations: partition lock: %w", err)
	}
	// A worker that waits on its own claim's lock holds the table in a
	// weak mode only, but never queue behind a long one.
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '10s'`); err != nil {
		return fmt.Errorf("migrations: partitions: %w", err)
	}
	last := p.Bucket(now).Add(time.Duration(p.Ahead) * p.Width)
	start := p.Bucket(from)
	if n := last.Sub(start) / p.Width; n > maxPartitions {
		return fmt.Errorf("migrations: partitions: %d partitions needed from %s (at most %d)", n, start, maxPartitions)
	}
	for b := start; !b.After(last); b = b.Add(p.Width) {
		name := p.PartitionName(b)
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists); err != nil {
			return fmt.Errorf("migrations: partitions: %w", err)
		}
		if exists {
			continue
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE `+name+` (LIKE `+p.Table+` INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`); err != nil {
			return fmt.Errorf("migrations: create partition %s: %w", name, err)
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')`,
			p.Table, name, b.UTC().Format(time.RFC3339), b.Add(p.Width).UTC().Format(time.RFC3339))); err != nil {
			return fmt.Errorf("migrations: attach partition %s: %w", name, err)
		}
	}
	return nil
}
