package control

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxmq/inboxmq/internal/consumer"
)

// Channel is the PostgreSQL NOTIFY channel on which every change made
// through a [Store] is announced when it commits; the payload is the
// namespace. Every worker LISTENs on it to reload the controls; a tool of
// your own may LISTEN too, to see changes as they happen.
const Channel = "inboxmq_controls"

// DB is the narrow database interface the [Store] needs. *pgxpool.Pool,
// *pgx.Conn and pgx.Tx satisfy it; inside a transaction the change and its
// notification commit together.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Control is the runtime control row of one inbox namespace.
type Control struct {
	// Namespace is the inbox namespace (the route's namespace).
	Namespace string `json:"namespace"`
	// Paused stops the namespace's delivery loop while true.
	Paused bool `json:"paused"`
	// Concurrency limits the namespace's workers; 0 means its configured
	// concurrency.
	Concurrency int `json:"concurrency"`
	// Reason is the operator's note (may be empty).
	Reason string `json:"reason,omitempty"`
	// UpdatedBy names who made the last change.
	UpdatedBy string `json:"updated_by"`
	// UpdatedAt is when the last change was made.
	UpdatedAt time.Time `json:"updated_at"`
}

// Block is one blocked idempotency key, or key prefix, of a namespace.
type Block struct {
	// Namespace is the inbox namespace the block applies to.
	Namespace string `json:"namespace"`
	// Pattern is the key, or the key prefix when Prefix is true. It must not
	// be empty.
	Pattern string `json:"pattern"`
	// Prefix makes Pattern match every key that starts with it.
	Prefix bool `json:"prefix"`
	// Reason is the operator's note (may be empty).
	Reason string `json:"reason,omitempty"`
	// CreatedBy names who blocked it. Empty means the database user.
	CreatedBy string `json:"created_by"`
	// CreatedAt is when it was blocked (set by the database).
	CreatedAt time.Time `json:"created_at"`
}

// Matches reports whether key is blocked by b (namespace not checked).
func (b Block) Matches(key string) bool {
	if b.Prefix {
		return strings.HasPrefix(key, b.Pattern)
	}
	return key == b.Pattern
}

// Snapshot is the complete set of controls and blocks at one moment.
type Snapshot struct {
	// Controls are the namespaces' control rows, ordered by namespace.
	Controls []Control `json:"controls"`
	// Blocks are the blocked keys and prefixes, ordered by namespace and
	// pattern.
	Blocks []Block `json:"blocks"`
}

// ChangeOpts annotate a change. A nil *ChangeOpts means no reason and the
// database user as author.
type ChangeOpts struct {
	// By names the operator or tool making the change. Defaults to the
	// database user.
	By string
	// Reason is a free-text note stored with the change.
	Reason string
}

func (o *ChangeOpts) by() string {
	if o == nil {
		return ""
	}
	return o.By
}

func (o *ChangeOpts) reason() string {
	if o == nil {
		return ""
	}
	return o.Reason
}

// Store reads and writes the runtime controls in PostgreSQL (tables
// inboxmq_controls and inboxmq_blocks, created by the migrations). Every
// write also sends a NOTIFY on [Channel] in the same statement, so it is
// delivered exactly when the change commits. Store is safe for concurrent
// use.
type Store struct {
	db DB
}

// NewStore returns a store on db (a pool, a connection or a transaction).
func NewStore(db DB) *Store { return &Store{db: db} }

// ErrInvalid reports an invalid namespace, key or concurrency.
var ErrInvalid = errors.New("control: invalid argument")

func checkNamespace(name string) error {
	if !consumer.ValidName(name) {
		return fmt.Errorf("%w: namespace %q", ErrInvalid, name)
	}
	return nil
}

const upsertControl = `
WITH up AS (
    INSERT INTO inboxmq_controls AS c (consumer, paused, concurrency, reason, updated_by, updated_at)
    VALUES ($1, coalesce($2, false), coalesce($3, 0), nullif($4, ''), coalesce(nullif($5, ''), current_user), now())
    ON CONFLICT (consumer) DO UPDATE SET
        paused      = coalesce($2, c.paused),
        concurrency = coalesce($3, c.concurrency),
        reason      = nullif($4, ''),
        updated_by  = coalesce(nullif($5, ''), current_user),
        updated_at  = now()
    RETURNING consumer
)
SELECT pg_notify('` + Channel + `', consumer) FROM up`

func (s *Store) setControl(ctx context.Context, name string, paused *bool, conc *int, opts *ChangeOpts) error {
	if err := checkNamespace(name); err != nil {
		return err
	}
	if _, err := s.db.Exec(ctx, upsertControl, name, paused, conc, opts.reason(), opts.by()); err != nil {
		return fmt.Errorf("control: update %s: %w", name, err)
	}
	return nil
}

// Pause marks namespace paused. Running workers with their controls on
// stop taking deliveries within the pickup time (2s); in-flight work
// finishes and unacked deliveries stay in the queue.
func (s *Store) Pause(ctx context.Context, namespace string, opts *ChangeOpts) error {
	t := true
	return s.setControl(ctx, namespace, &t, nil, opts)
}

// Resume clears the pause of namespace.
func (s *Store) Resume(ctx context.Context, namespace string, opts *ChangeOpts) error {
	f := false
	return s.setControl(ctx, namespace, &f, nil, opts)
}

// SetConcurrency limits namespace to n concurrent deliveries per worker
// process; n = 0 restores the namespace's configured concurrency. A negative
// n is an error.
func (s *Store) SetConcurrency(ctx context.Context, namespace string, n int, opts *ChangeOpts) error {
	if n < 0 {
		return fmt.Errorf("%w: concurrency %d is negative", ErrInvalid, n)
	}
	return s.setControl(ctx, namespace, nil, &n, opts)
}

const upsertBlock = `
WITH up AS (
    INSERT INTO inboxmq_blocks (consumer, pattern, is_prefix, reason, created_by)
    VALUES ($1, $2, $3, nullif($4, ''), coalesce(nullif($5, ''), current_user))
    ON CONFLICT (consumer, is_prefix, pattern) DO UPDATE SET
        reason = excluded.reason, created_by = excluded.created_by
    RETURNING consumer
)
SELECT pg_notify('` + Channel + `', consumer) FROM up`

// Block blocks b.Pattern (a key, or a prefix when b.Prefix) for
// b.Namespace. Blocking an already blocked pattern updates its reason.
func (s *Store) Block(ctx context.Context, b Block) error {
	if err := checkNamespace(b.Namespace); err != nil {
		return err
	}
	if b.Pattern == "" {
		return fmt.Errorf("%w: empty key or prefix", ErrInvalid)
	}
	if _, err := s.db.Exec(ctx, upsertBlock, b.Namespace, b.Pattern, b.Prefix, b.Reason, b.CreatedBy); err != nil {
		return fmt.Errorf("control: block %s: %w", b.Pattern, err)
	}
	return nil
}

const deleteBlock = `
WITH del AS (
    DELETE FROM inboxmq_blocks WHERE consumer = $1 AND pattern = $2 AND is_prefix = $3
    RETURNING consumer
)
SELECT pg_notify('` + Channel + `', consumer) FROM del`

// Unblock removes the block of pattern (a key, or a prefix when prefix is
// true) for namespace. It reports whether such a block existed.
func (s *Store) Unblock(ctx context.Context, namespace, pattern string, prefix bool) (bool, error) {
	if err := checkNamespace(namespace); err != nil {
		return false, err
	}
	tag, err := s.db.Exec(ctx, deleteBlock, namespace, pattern, prefix)
	if err != nil {
		return false, fmt.Errorf("control: unblock %s: %w", pattern, err)
	}
	return tag.RowsAffected() > 0, nil
}

// List returns every control row and block.
func (s *Store) List(ctx context.Context) (*Snapshot, error) {
	rows, err := s.db.Query(ctx, `SELECT consumer, paused, concurrency, coalesce(reason, ''), updated_by, updated_at
		FROM inboxmq_controls ORDER BY consumer`)
	if err != nil {
		return nil, fmt.Errorf("control: list controls: %w", err)
	}
	controls, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Control, error) {
		var c Control
		err := r.Scan(&c.Namespace, &c.Paused, &c.Concurrency, &c.Reason, &c.UpdatedBy, &c.UpdatedAt)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("control: list controls: %w", err)
	}
	rows, err = s.db.Query(ctx, `SELECT consumer, pattern, is_prefix, coalesce(reason, ''), created_by, created_at
		FROM inboxmq_blocks ORDER BY consumer, pattern, is_prefix`)
	if err != nil {
		return nil, fmt.Errorf("control: list blocks: %w", err)
	}
	blocks, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Block, error) {
		var b Block
		err := r.Scan(&b.Namespace, &b.Pattern, &b.Prefix, &b.Reason, &b.CreatedBy, &b.CreatedAt)
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("control: list blocks: %w", err)
	}
	return &Snapshot{Controls: controls, Blocks: blocks}, nil
}

// Blocked reports the first block that matches key for namespace, read from
// the database now (the workers answer the same question from memory).
func (s *Store) Blocked(ctx context.Context, namespace, key string) (Block, bool, error) {
	rows, err := s.db.Query(ctx, `SELECT consumer, pattern, is_prefix, coalesce(reason, ''), created_by, created_at
		FROM inboxmq_blocks
		WHERE consumer = $1 AND ((NOT is_prefix AND pattern = $2) OR (is_prefix AND starts_with($2, pattern)))
		ORDER BY is_prefix, pattern LIMIT 1`, namespace, key)
	if err != nil {
		return Block{}, false, fmt.Errorf("control: blocked: %w", err)
	}
	b, err := pgx.CollectExactlyOneRow(rows, func(r pgx.CollectableRow) (Block, error) {
		var b Block
		err := r.Scan(&b.Namespace, &b.Pattern, &b.Prefix, &b.Reason, &b.CreatedBy, &b.CreatedAt)
		return b, err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return Block{}, false, nil
	}
	if err != nil {
		return Block{}, false, fmt.Errorf("control: blocked: %w", err)
	}
	return b, true, nil
}
