package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/combine"
	"github.com/inboxmq/inboxmq/migrations"
	"github.com/inboxmq/inboxmq/retry"
)

// DefaultTable is the inbox table created by package migrations.
const DefaultTable = "inboxmq_inbox"

// Record statuses, the values of the status column.
const (
	// RecordReceived: seen on a redelivery (the crash-loop counter), nothing
	// committed yet.
	RecordReceived = "received"
	// RecordProcessing: claimed in claim/lease mode.
	RecordProcessing = "processing"
	// RecordCompleted: the effect is committed; duplicates are acked.
	RecordCompleted = "completed"
	// RecordFailed: the last attempt failed; a retry may take the key up.
	RecordFailed = "failed"
	// RecordDead: dead-lettered; a replay may take the key up again.
	RecordDead = "dead"
)

// StoreConfig configures a [Store]. A nil *StoreConfig means defaults.
type StoreConfig struct {
	// Table is the inbox table, optionally schema-qualified ("app.inbox").
	// Each part must be a plain identifier (letters, digits, underscores);
	// it is quoted in every statement. Defaults to DefaultTable, resolved
	// through the connection's search_path.
	Table string
	// Logger receives the store's warnings and the reconciler's findings.
	// Defaults to nil, which discards them.
	Logger *slog.Logger
	// CrashLimit bounds crash loops on classic queues: a delivery that the
	// broker has redelivered (the previous worker died or lost its
	// connection before settling it) more than CrashLimit times fails
	// permanently with reason crash_loop. Defaults to 10; -1 disables it.
	CrashLimit int
	// MaxResultBytes bounds a handler's result
	// (inboxtype.Message.SetResult), JSON-encoded: a larger one fails the
	// delivery permanently (reason result_too_large) and nothing of it
	// commits. Defaults to 64 KiB.
	MaxResultBytes int
	// CleanupTimeout bounds the statements the inbox runs after a handler's
	// context may have ended (recording a failure, releasing a claim).
	// Defaults to 5s.
	CleanupTimeout time.Duration
}

// GroupCommit configures group commit: deliveries handled concurrently are
// collected into batches that share a transaction (in claim mode, their
// completions). A zero field takes its default.
//
// A batch only fills if that many deliveries are handled at once: run at
// least [GroupCommit.Concurrency] handlers, as a worker's route does by
// itself when its concurrency is left at 0. With fewer, batches stay small
// and group commit can be slower than one transaction per delivery.
type GroupCommit struct {
	// MaxBatch is the most deliveries in one batch. A BatchHandler's batch
	// commits in one transaction; the deliveries of Handler and
	// ClaimHandler take a savepoint each, and a batch of more than 64 of
	// them commits in transactions of at most 64 (PostgreSQL keeps 64
	// subtransactions per transaction in memory). Defaults to 256.
	MaxBatch int
	// MaxWait is how long the first delivery of a batch waits for others:
	// the latency group commit adds under light load. Defaults to 2ms.
	MaxWait time.Duration
	// MaxInFlight is the most batches of one handler executing at once
	// (each holds a pool connection). Raise it while cores and pool
	// connections are free. Defaults to 2.
	MaxInFlight int
}

// withDefaults returns g with its defaults applied: the one place where
// group commit's defaults are resolved.
func (g GroupCommit) withDefaults() GroupCommit {
	if g.MaxBatch <= 0 {
		g.MaxBatch = 256
	}
	if g.MaxWait <= 0 {
		g.MaxWait = 2 * time.Millisecond
	}
	if g.MaxInFlight <= 0 {
		g.MaxInFlight = 2
	}
	return g
}

// Concurrency returns how many deliveries a handler must handle at once to
// fill every batch in flight: MaxBatch × MaxInFlight, defaults applied
// (512). A nil GroupCommit returns 0.
func (g *GroupCommit) Concurrency() int {
	if g == nil {
		return 0
	}
	d := g.withDefaults()
	return d.MaxBatch * d.MaxInFlight
}

func (g GroupCommit) validate() error {
	if g.MaxBatch > 10000 {
		return fmt.Errorf("inbox: GroupCommit.MaxBatch %d is too large (at most 10000)", g.MaxBatch)
	}
	return nil
}

func (c *StoreConfig) withDefaults() StoreConfig {
	var out StoreConfig
	if c != nil {
		out = *c
	}
	if out.Table == "" {
		out.Table = DefaultTable
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	if out.CrashLimit == 0 {
		out.CrashLimit = 10
	}
	if out.CleanupTimeout <= 0 {
		out.CleanupTimeout = defaultCleanupTimeout
	}
	if out.MaxResultBytes <= 0 {
		out.MaxResultBytes = defaultMaxResultBytes
	}
	return out
}

const defaultCleanupTimeout = 5 * time.Second

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

func parseTable(s string) (pgx.Identifier, error) {
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("inbox: invalid table name %q", s)
	}
	for _, p := range parts {
		if !identRE.MatchString(p) {
			return nil, fmt.Errorf("inbox: invalid table name %q", s)
		}
	}
	return pgx.Identifier(parts), nil
}

func (c StoreConfig) validate() (pgx.Identifier, error) {
	id, err := parseTable(c.Table)
	if err != nil {
		return nil, err
	}
	if c.CrashLimit < -1 {
		return nil, fmt.Errorf("inbox: CrashLimit %d: want -1 (disabled) or a positive bound", c.CrashLimit)
	}
	return id, nil
}

// Store is the PostgreSQL inbox: one row per (consumer, idempotency key),
// the source of truth for "has this job's effect been committed?". It is
// safe for concurrent use. Build it with [NewStore].
type Store struct {
	pool  *pgxpool.Pool
	cfg   StoreConfig
	table string // quoted, ready for SQL
	sql   statements
	// part is the table's partitioning; nil for an unpartitioned table.
	part *migrations.Partitioning
	// leases shares claim mode's claims between concurrent deliveries.
	leases *combine.Combiner[*leaseReq]
	// heal guards the creation of partitions that ran out (partitioned).
	heal partitionHealer
	// owner is the owner session of a started store (owner.go); sessions
	// says whether the table can record it.
	owner    owner
	sessions bool

	// checked is set once Check has read the table's layout into sql and
	// part; checkMu serialises the Checks.
	checkMu sync.Mutex
	checked atomic.Bool
}

// NewStore validates cfg and returns a Store on pool. It does no I/O: the
// store serves handlers, reads and the maintenance jobs only after
// [Store.Check] has passed (Worker.Start calls it); before that they
// return [ErrNotChecked].
func NewStore(pool *pgxpool.Pool, cfg *StoreConfig) (*Store, error) {
	if pool == nil {
		return nil, errors.New("inbox: nil pool")
	}
	c := cfg.withDefaults()
	id, err := c.validate()
	if err != nil {
		return nil, err
	}
	s := &Store{pool: pool, cfg: c, table: id.Sanitize()}
	s.leases = s.newLeaseRounds()
	s.owner.svc.Name = "inbox: owner session"
	return s, nil
}

// Check checks that the store's pool reaches a writable primary holding
// the inbox table, and reads how the table is laid out (partitioned or
// not), which the store's statements follow. It refuses a read replica or
// a read-only session ([ErrReplica]): replicas lag, so the final check
// must run on the primary. A missing table returns [ErrNoTable] (run the
// migrations). Check may be called again; the layout read first stays.
func (s *Store) Check(ctx context.Context) error {
	var inRecovery, readOnly bool
	var reg *string
	err := s.pool.QueryRow(ctx,
		`SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on', to_regclass($1)::text`,
		s.table).Scan(&inRecovery, &readOnly, &reg)
	if err != nil {
		return fmt.Errorf("inbox: check database: %w", err)
	}
	if inRecovery || readOnly {
		return ErrReplica
	}
	if reg == nil {
		return fmt.Errorf("%w (table %s)", ErrNoTable, s.table)
	}
	s.checkMu.Lock()
	defer s.checkMu.Unlock()
	if s.checked.Load() {
		return nil
	}
	// A partitioned inbox (migrations.PartitionInbox) is detected, not
	// configured: the statements must match the table.
	var fn string
	switch p, err := migrations.LoadPartitioning(ctx, s.pool, s.cfg.Table); {
	case err == nil:
		s.part, fn = p, p.Func
	case !errors.Is(err, migrations.ErrNotPartitioned):
		return fmt.Errorf("inbox: check partitioning: %w", err)
	}
	// Claims name their owner session only on a table that has the
	// column (migration 00007); before it, claims keep their leases alone.
	var sessions bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute
WHERE attrelid = to_regclass($1) AND attname = 'owner_session' AND NOT attisdropped)`, s.table).Scan(&sessions); err != nil {
		return fmt.Errorf("inbox: check the owner_session column: %w", err)
	}
	if !sessions {
		s.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "inbox: the inbox table has no owner_session column (run the migrations): "+
			"a claim whose owner died waits out its lease", slog.String("table", s.table))
	}
	s.sessions = sessions
	s.sql = buildStatements(s.table, fn, sessions)
	if !configured(s.pool.Config()) {
		s.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "inbox: the pool was not built through inbox.ConfigurePool: "+
			"connections it opens after start-up are not checked for the primary, and may reach a standby or a fenced node after a fail-over")
	}
	s.checked.Store(true)
	return nil
}

// ready returns ErrNotChecked until Check has passed. Every entry point of
// the store calls it first: the statements are those of the table's
// layout, known only then.
func (s *Store) ready() error {
	if !s.checked.Load() {
		return ErrNotChecked
	}
	return nil
}

// Pool returns the pool the store runs on.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Table returns the quoted name of the inbox table.
func (s *Store) Table() string { return s.table }

// Partitioned reports whether the inbox table is partitioned by time
// (migrations.PartitionInbox): retention then drops whole partitions.
func (s *Store) Partitioned() bool { return s.part != nil }

// Record is one inbox row. Pointer fields are nil when the column is NULL.
type Record struct {
	// Namespace is the inbox namespace (the route's namespace).
	Namespace string
	// Key is the idempotency key.
	Key string
	// Status is one of the Record* constants.
	Status string
	// Fingerprint identifies the payload (SHA-256 of the body by default).
	Fingerprint []byte
	// Owner is the claim's owner token (claim mode, while processing).
	Owner *string
	// Fence increases with every claim of the key.
	Fence int64
	// LeaseUntil is when a claim of claim mode expires.
	LeaseUntil *time.Time
	// Attempts is the broker attempt number (the x-attempt header,
	// inboxtype.Delivery.Attempt) of the last delivery that took the key up
	// or failed on it. In-process tries and redeliveries of one broker
	// attempt do not add to it, so a dead-lettered key's row shows the
	// attempt its dead-letter copy carries; a replay starts again at 1.
	Attempts int
	// Deliveries counts the broker's redeliveries of the key on classic
	// queues (deliveries with the redelivered flag: a worker died or lost
	// its connection before settling): the crash-loop counter of
	// StoreConfig.CrashLimit. It does not count first deliveries, retries
	// or quorum queues' deliveries, and starts again after the row was
	// dead.
	Deliveries int
	// LastError and LastFailedAt describe the last failed attempt.
	LastError    *string
	LastFailedAt *time.Time
	// MessageID is the broker message id of the last attempt.
	MessageID *string
	// Result is the job's result, stored with the effect
	// (inboxtype.Message.SetResult), if any: what duplicates of the key
	// get back, byte for byte the bytes the handler set.
	Result json.RawMessage
	// Steps are the recovery points of claim mode: name → JSON result.
	Steps map[string]json.RawMessage
	// FirstSeenAt, UpdatedAt and CompletedAt are the row's times.
	FirstSeenAt time.Time
	UpdatedAt   time.Time
	CompletedAt *time.Time
}

const recordColumns = `consumer, key, status, fingerprint, owner, fence, lease_until, attempts, deliveries,
	last_error, last_failed_at, message_id, result, steps, first_seen_at, updated_at, completed_at`

func scanRecord(row pgx.Row) (*Record, error) {
	var r Record
	// The result is read as bytes: a json.RawMessage target would go
	// through json.Unmarshal, which drops whitespace around the value.
	err := row.Scan(&r.Namespace, &r.Key, &r.Status, &r.Fingerprint, &r.Owner, &r.Fence, &r.LeaseUntil,
		&r.Attempts, &r.Deliveries, &r.LastError, &r.LastFailedAt, &r.MessageID, (*[]byte)(&r.Result), &r.Steps,
		&r.FirstSeenAt, &r.UpdatedAt, &r.CompletedAt)
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// Get returns the inbox row of (namespace, key), or [ErrNotFound].
func (s *Store) Get(ctx context.Context, namespace, key string) (*Record, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	r, err := scanRecord(s.pool.QueryRow(ctx,
		`SELECT `+recordColumns+` FROM `+s.table+` WHERE consumer = $1 AND key = $2`, namespace, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("inbox: get: %w", err)
	}
	return r, nil
}

// ReplyResult returns the result a request's reply carries (it fits the
// consumer's reply hook): the delivery's own — once the inbox has ruled,
// the bytes of the key's row —, or, for a duplicate that holds none
// because the completed-cache acked it without reading the row, the
// result stored on the key's completed row.
func (s *Store) ReplyResult(ctx context.Context, d *inboxtype.Delivery, dec retry.Decision) (json.RawMessage, error) {
	if dec.Kind != retry.KindDuplicate || d.Result != nil || d.Key == "" {
		return d.Result, nil
	}
	rec, err := s.Get(ctx, d.Namespace, d.Key)
	switch {
	case errors.Is(err, ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, err
	case rec.Status != RecordCompleted:
		return nil, nil
	}
	return rec.Result, nil
}

// Stale returns the claims (status processing) whose lease ended more than
// olderThan ago, oldest first, at most 1000 rows. It only reads; the
// [Reconciler] acts on them.
func (s *Store) Stale(ctx context.Context, olderThan time.Duration) ([]*Record, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT `+recordColumns+` FROM `+s.table+`
		WHERE status = 'processing' AND lease_until < now() - $1::bigint * interval '1 microsecond'
		ORDER BY lease_until LIMIT 1000`, olderThan.Microseconds())
	if err != nil {
		return nil, fmt.Errorf("inbox: stale: %w", err)
	}
	defer rows.Close()
	var out []*Record
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("inbox: stale: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inbox: stale: %w", err)
	}
	return out, nil
}

// cleanupCtx is a context for statements that must run even though the
// handler's context ended: not cancelled with ctx, bounded by
// CleanupTimeout.
func (s *Store) cleanupCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), s.cfg.CleanupTimeout)
}
