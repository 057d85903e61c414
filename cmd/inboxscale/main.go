// Command inboxscale measures the inbox table at scale, today's table and
// the partitioned one (migrations.PartitionInbox) side by side, in a
// database of its own (inboxmq_scale_<unix time>, dropped at the end):
//
//  1. claim throughput and latency (p50, p99) through inbox.Handler at 0,
//     10 M, 100 M… rows already in the table (-sizes), the rows generated
//     in the database and completed over a 7-day window (a bulk load: the
//     indexes dropped, INSERT … SELECT generate_series in chunks over
//     -fill-conns connections, VACUUM, the indexes built again, ANALYZE;
//     see table.fill); a share of the claims (-dup) are copies of keys
//     already in the table, which the partitioned table must find in any
//     partition;
//  2. retention over a simulated week at a steady 1,000 msg/s: the volume
//     is scaled by -sim-scale (0.01: 36,000 rows per simulated hour) and
//     the time compressed (each simulated hour of inserts and its retention
//     pass run back to back, as fast as the database goes); it reports the
//     time of each retention pass, the dead tuples it leaves, and the table
//     and index sizes at the end;
//  3. table and index sizes at each size.
//
// It sizes itself to the free disk of PostgreSQL's data directory (statfs;
// -disk-budget of it), from the bytes per row it measured at the previous
// size (a prior before the first): at each size it measures the two tables
// side by side when both fit, else one at a time (each filled, measured and
// emptied in turn, so the disk holds one table), and stops short, saying
// so, when even one does not fit. Figures on a shared or loaded machine
// are indicative only.
//
//	go run ./cmd/inboxscale -sizes 0,10000000
package main

import (
	"cmp"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/migrations"
	"github.com/inboxmq/inboxmq/retry"
)

type options struct {
	dbURL      string
	sizes      []int64
	duration   time.Duration
	workers    int
	rounds     int
	dup        float64
	chunk      int64
	fillConns  int
	maintMem   string
	database   string
	sequential bool
	diskBudget float64
	simScale   float64
	simHours   int
	width      time.Duration
	keep       bool
}

func main() {
	var o options
	var sizes string
	flag.StringVar(&o.dbURL, "db", cmp.Or(os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"), "PostgreSQL URL of a role that may create databases")
	flag.StringVar(&sizes, "sizes", "0,10000000", "rows already in the table, comma-separated, ascending")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "claim measurement per table and size")
	flag.IntVar(&o.workers, "workers", 8, "concurrent claimers")
	flag.IntVar(&o.rounds, "rounds", 2, "measurements per table and size, the tables alternating (a loaded machine drifts)")
	flag.Float64Var(&o.dup, "dup", 0.1, "share of claims that are copies of keys already in the table")
	flag.Int64Var(&o.chunk, "chunk", 1_000_000, "rows per INSERT when filling")
	flag.IntVar(&o.fillConns, "fill-conns", max(runtime.NumCPU(), 2), "connections inserting the fill's chunks at once")
	flag.StringVar(&o.maintMem, "maintenance-work-mem", "1GB", "maintenance_work_mem of the session that builds the indexes after a fill")
	flag.StringVar(&o.database, "database", "", "database to create for the run and drop at the end (default inboxmq_scale_<unix time>); it must not exist")
	flag.BoolVar(&o.sequential, "one-at-a-time", false, "measure the tables one after the other at every size, even when both fit the disk budget")
	flag.Float64Var(&o.diskBudget, "disk-budget", 0.5, "share of the data directory's free disk the run may use")
	flag.Float64Var(&o.simScale, "sim-scale", 0.01, "retention simulation: share of 1,000 msg/s inserted per simulated hour (0 skips it)")
	flag.IntVar(&o.simHours, "sim-hours", 72, "retention simulation: steady-state hours after the first 7 days")
	flag.DurationVar(&o.width, "width", 24*time.Hour, "partition width of the partitioned table")
	flag.BoolVar(&o.keep, "keep", false, "keep the database at the end")
	flag.Parse()
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil || n < 0 {
			log.Fatalf("inboxscale: -sizes: %q", s)
		}
		o.sizes = append(o.sizes, n)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		log.Fatalf("inboxscale: %v", err)
	}
}

// table is one of the two tables under test.
type table struct {
	name  string // "plain" or "partitioned": also its schema
	pool  *pgxpool.Pool
	store *inbox.Store
	part  *migrations.Partitioning
	rows  int64
	// Measured after the last fill: (heap + indexes) / rows, indexes / rows.
	bytesPerRow, indexPerRow float64
}

// The bytes per row assumed before a fill measured them: at 10 M rows the
// plain table took 281 (heap and indexes), the partitioned one 301, of
// which 98 and 111 of indexes.
const (
	defaultBytesPerRow = 300
	defaultIndexPerRow = 115
)

// sideBySide fills both tables to size rows and measures them, the tables
// alternating -rounds times.
func sideBySide(ctx context.Context, tables []*table, size int64, o options) error {
	for _, t := range tables {
		if err := t.fillAndReport(ctx, size, o); err != nil {
			return err
		}
	}
	for range o.rounds {
		for _, t := range tables {
			if err := t.measureAndPrint(ctx, size, o); err != nil {
				return err
			}
		}
	}
	return nil
}

// oneAtATime empties both tables, then fills each to size rows in turn,
// measures it -rounds times and empties it again: the disk holds one table
// of size rows at most.
func oneAtATime(ctx context.Context, tables []*table, size int64, o options) error {
	for _, t := range tables {
		if err := t.reset(ctx); err != nil {
			return err
		}
	}
	for _, t := range tables {
		if err := t.fillAndReport(ctx, size, o); err != nil {
			return err
		}
		for range o.rounds {
			if err := t.measureAndPrint(ctx, size, o); err != nil {
				return err
			}
		}
		if err := t.reset(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (t *table) fillAndReport(ctx context.Context, size int64, o options) error {
	st, err := t.fill(ctx, size, o)
	if err != nil {
		return err
	}
	if st.rows > 0 {
		d := st.total()
		fmt.Printf("  (filled %s with %d rows to %d in %s: %.0f rows/s; insert %s over %d connections, vacuum %s, indexes %s, analyze %s)\n",
			t.name, st.rows, size, d.Round(time.Second), float64(st.rows)/d.Seconds(), st.insert.Round(time.Second),
			o.fillConns, st.vacuum.Round(time.Second), st.index.Round(time.Second), st.analyze.Round(time.Second))
	}
	if size > 0 {
		heap, idx, _ := t.sizes(ctx)
		t.bytesPerRow = float64(heap+idx) / float64(size)
		t.indexPerRow = float64(idx) / float64(size)
	}
	// As the previous sizes' claims left it: their dead tuples reclaimed,
	// the visibility map and the statistics up to date.
	if _, err := t.pool.Exec(ctx, "VACUUM ANALYZE inboxmq_inbox"); err != nil {
		return fmt.Errorf("vacuum %s: %w", t.name, err)
	}
	return nil
}

func (t *table) measureAndPrint(ctx context.Context, size int64, o options) error {
	m, err := t.measure(ctx, o)
	if err != nil {
		return err
	}
	heap, idx, parts := t.sizes(ctx)
	fmt.Printf("%-12d %-12s %10.0f %9s %9s %9s %9s %11.0f %11.0f %6d\n", size, t.name, m.rate,
		ms(m.newLat, 50), ms(m.newLat, 99), ms(m.dupLat, 50), ms(m.dupLat, 99), mb(heap), mb(idx), parts)
	return nil
}

func run(ctx context.Context, o options) error {
	admin, err := pgx.Connect(ctx, o.dbURL)
	if err != nil {
		return err
	}
	defer admin.Close(context.Background())
	db := cmp.Or(o.database, fmt.Sprintf("inboxmq_scale_%d", time.Now().Unix()))
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
		return err
	}
	fmt.Printf("database %s\n", db)
	if !o.keep {
		defer func() {
			if _, err := admin.Exec(context.Background(), "DROP DATABASE "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)"); err != nil {
				log.Printf("inboxscale: drop %s: %v", db, err)
			}
		}()
	}
	var dataDir, version string
	if err := admin.QueryRow(ctx, `SELECT current_setting('data_directory'), version()`).Scan(&dataDir, &version); err != nil {
		return err
	}
	free := freeBytes(dataDir)
	budget := int64(float64(free) * o.diskBudget)
	fmt.Printf("%s\ndata directory %s: %.1f GB free, budget %.1f GB (-disk-budget %g)\n",
		version, dataDir, gb(free), gb(budget), o.diskBudget)
	fmt.Printf("machine: %d cores (shared: figures are indicative)\n\n", numCPU())

	cfg, err := pgxpool.ParseConfig(o.dbURL)
	if err != nil {
		return err
	}
	cfg.ConnConfig.Database = db
	cfg.MaxConns = int32(o.workers + 4) //nolint:gosec // a small flag
	plain, err := newTable(ctx, cfg, "plain", nil)
	if err != nil {
		return err
	}
	part, err := newTable(ctx, cfg, "partitioned", &migrations.PartitionConfig{Width: o.width, Ahead: 3})
	if err != nil {
		return err
	}
	tables := []*table{plain, part}
	defer plain.pool.Close()
	defer part.pool.Close()

	fmt.Println("== claims (inbox.Handler, transactional mode, empty handler) ==")
	fmt.Printf("%d workers, %s per table and size, %.0f%% copies of existing keys\n", o.workers, o.duration, o.dup*100)
	fmt.Printf("%-12s %-12s %10s %9s %9s %9s %9s %11s %11s %6s\n",
		"rows", "table", "claims/s", "new p50", "new p99", "dup p50", "dup p99", "heap MB", "index MB", "parts")
	// Bytes of database per row (heap, indexes, free space) and of indexes
	// per row: measured after each fill, a prior until the first.
	bytesPerRow, indexPerRow := float64(defaultBytesPerRow), float64(defaultIndexPerRow)
	measured := false
sizes:
	for _, size := range o.sizes {
		used, err := dbSize(ctx, plain.pool)
		if err != nil {
			return err
		}
		// A fill rebuilds the table's indexes over all its rows, one at a
		// time: the largest one's sort (the key's tuples, unpadded) spills
		// about half the indexes' bytes to temporary files meanwhile.
		spill := int64(float64(size) * indexPerRow / 2)
		both := spill
		for _, t := range tables {
			both += int64(float64(max(size-t.rows, 0)) * bytesPerRow)
		}
		// One at a time: the tables are emptied first, so the peak is one
		// table of size rows (and what the database held without them).
		var held int64
		for _, t := range tables {
			heap, idx, _ := t.sizes(ctx)
			held += heap + idx
		}
		one := int64(float64(size)*bytesPerRow) + spill
		prior := ""
		if !measured {
			prior = ", a prior: none measured yet"
		}
		switch {
		case !o.sequential && used+both <= budget:
			fmt.Printf("-- %d rows: side by side (both tables need about %.1f GB more, %.0f+%.0f bytes per row%s; budget %.1f GB, used %.1f GB)\n",
				size, gb(both), bytesPerRow, indexPerRow, prior, gb(budget), gb(used))
			if err := sideBySide(ctx, tables, size, o); err != nil {
				return err
			}
		case used-held+one <= budget:
			why := "-one-at-a-time"
			if !o.sequential {
				why = fmt.Sprintf("both tables would need about %.1f GB more, over the budget", gb(both))
			}
			fmt.Printf("-- %d rows: one table at a time, each filled, measured and emptied (%s; one table needs about %.1f GB, %.0f+%.0f bytes per row%s; budget %.1f GB)\n",
				size, why, gb(one), bytesPerRow, indexPerRow, prior, gb(budget))
			if err := oneAtATime(ctx, tables, size, o); err != nil {
				return err
			}
		default:
			fmt.Printf("stopping short of %d rows: even one table at a time needs about %.1f GB (%.0f+%.0f bytes per row%s), over the budget of %.1f GB (%.1f GB free, -disk-budget %g)\n",
				size, gb(one), bytesPerRow, indexPerRow, prior, gb(budget), gb(free), o.diskBudget)
			break sizes
		}
		for _, t := range tables {
			if t.bytesPerRow > 0 {
				if !measured {
					bytesPerRow, indexPerRow, measured = 0, 0, true
				}
				bytesPerRow, indexPerRow = max(bytesPerRow, t.bytesPerRow), max(indexPerRow, t.indexPerRow)
			}
		}
	}
	if measured {
		fmt.Printf("bytes per row (heap, indexes and free space; the larger table's): %.0f, of which indexes %.0f\n", bytesPerRow, indexPerRow)
	}
	if o.simScale > 0 {
		if err := simulate(ctx, cfg, o); err != nil {
			return err
		}
	}
	return nil
}

func newTable(ctx context.Context, base *pgxpool.Config, name string, pc *migrations.PartitionConfig) (*table, error) {
	boot, err := pgxpool.NewWithConfig(ctx, base)
	if err != nil {
		return nil, err
	}
	_, err = boot.Exec(ctx, "CREATE SCHEMA "+name)
	boot.Close()
	if err != nil {
		return nil, err
	}
	cfg := base.Copy()
	cfg.ConnConfig.RuntimeParams["search_path"] = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := migrations.Up(ctx, pool); err != nil {
		return nil, err
	}
	t := &table{name: name, pool: pool}
	if pc != nil {
		if t.part, err = migrations.PartitionInbox(ctx, pool, pc); err != nil {
			return nil, err
		}
		// The partitions of the 7-day window the rows are spread over.
		if err := migrations.CreatePartitions(ctx, pool, t.part, time.Now().Add(-8*24*time.Hour)); err != nil {
			return nil, err
		}
	}
	if t.store, err = inbox.NewStore(pool, nil); err != nil {
		return nil, err
	}
	if err := t.store.Check(ctx); err != nil {
		return nil, err
	}
	return t, nil
}

type measurement struct {
	rate           float64
	newLat, dupLat []time.Duration
}

func (t *table) measure(ctx context.Context, o options) (measurement, error) {
	h := inbox.Handler(t.store, func(context.Context, pgx.Tx, *inboxtype.Message[struct{}]) error { return nil }, nil)
	var (
		mu       sync.Mutex
		m        measurement
		n        atomic.Int64
		seq      atomic.Int64
		firstErr error
		wg       sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	run := time.Now().UnixNano()
	for w := range o.workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(run), uint64(w))) //nolint:gosec // keys, not secrets
			var newLat, dupLat []time.Duration
			for ctx.Err() == nil {
				dup := t.rows > 0 && rng.Float64() < o.dup
				var key string
				if dup {
					key = md5Key(rng.Int64N(t.rows) + 1)
				} else {
					key = fmt.Sprintf("new-%d-%d", run, seq.Add(1))
				}
				d := inboxtype.NewDelivery("scale", "bench", "w", &amqp.Delivery{MessageId: key, Body: []byte("{}")})
				d.Key = key
				msg := &inboxtype.Message[struct{}]{ID: key, Key: key, Namespace: "bench", Attempt: 1, Delivery: d}
				began := time.Now()
				err := h.Handle(ctx, msg)
				el := time.Since(began)
				if ctx.Err() != nil {
					break
				}
				switch {
				case dup && err != nil && isDuplicate(err):
					dupLat = append(dupLat, el)
				case !dup && err == nil:
					newLat = append(newLat, el)
				default:
					mu.Lock()
					firstErr = cmp.Or(firstErr, fmt.Errorf("%s: claim %s (copy %v): %w", t.name, key, dup, err))
					mu.Unlock()
					return
				}
				n.Add(1)
			}
			mu.Lock()
			m.newLat = append(m.newLat, newLat...)
			m.dupLat = append(m.dupLat, dupLat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	m.rate = float64(n.Load()) / o.duration.Seconds()
	return m, firstErr
}

func (t *table) sizes(ctx context.Context) (heap, idx int64, parts int) {
	_ = t.pool.QueryRow(ctx, `WITH tree(r) AS (SELECT 'inboxmq_inbox'::regclass UNION SELECT relid FROM pg_partition_tree('inboxmq_inbox'))
		SELECT sum(pg_table_size(r))::bigint, sum(pg_indexes_size(r))::bigint, count(*) - 1 FROM tree`).Scan(&heap, &idx, &parts)
	return heap, idx, parts
}

func dbSize(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT pg_database_size(current_database())`).Scan(&n)
	return n, err
}

func freeBytes(dir string) int64 {
	for d := dir; d != ""; d = d[:max(strings.LastIndex(d, "/"), 0)] {
		var st syscall.Statfs_t
		if syscall.Statfs(d, &st) == nil {
			return int64(st.Bavail) * st.Bsize //nolint:gosec // block counts fit
		}
		if d == "/" {
			break
		}
	}
	var st syscall.Statfs_t
	if syscall.Statfs("/", &st) == nil {
		return int64(st.Bavail) * st.Bsize //nolint:gosec // block counts fit
	}
	return 0
}

func ms(lat []time.Duration, p int) string {
	if len(lat) == 0 {
		return "-"
	}
	slices.Sort(lat)
	i := min(len(lat)*p/100, len(lat)-1)
	return fmt.Sprintf("%.2fms", float64(lat[i].Microseconds())/1000)
}

func gb(n int64) float64 { return float64(n) / (1 << 30) }
func mb(n int64) float64 { return float64(n) / (1 << 20) }

func md5Key(n int64) string {
	sum := md5.Sum([]byte(strconv.FormatInt(n, 10))) //nolint:gosec // the fill's key, not a secret
	return hex.EncodeToString(sum[:])
}

func isDuplicate(err error) bool { return errors.Is(err, retry.ErrDuplicate) }

func numCPU() int { return runtime.NumCPU() }
