package control

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxmq/inboxmq/consumer"
)

// Channel is the PostgreSQL NOTIFY channel on which every change made
// through a [Store] is announced (the payload is the consumer's name).
// Watchers LISTEN on it and reload their snapshot.
const Channel = "inboxmq_controls"

// DB is the narrow database interface the [Store] needs. *pgxpool.Pool,
// *pgx.Conn and pgx.Tx satisfy it; inside a transaction the change and its
// notification commit together.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Control is the runtime control row of one consumer.
type Control struct {
	// Consumer is the inbox namespace (consumer.HandlerOpts.Namespace).
	Consumer string `json:"consumer"`
	// Paused stops the consumer's delivery loop while true.
	Paused bool `json:"paused"`
	// Concurrency limits the consumer's workers; 0 means its configured
	// concurrency.
	Concurrency int `json:"concurrency"`
	// Reason is the operator's note (may be empty).
	Reason string `json:"reason,omitempty"`
	// UpdatedBy names who made the last change.
	UpdatedBy string `json:"updated_by"`
	// UpdatedAt is when the last change was made.
	UpdatedAt time.Time `json:"updated_at"`
}

// Block is one blocked idempotency key, or key prefix, of a consumer.
type Block struct {
	// Consumer is the inbox namespace the block applies to.
	Consumer string `json:"consumer"`
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

// Matches reports whether key is blocked by b (consumer not checked).
func (b Block) Matches(key string) bool {
	if b.Prefix {
		return strings.HasPrefix(key, b.Pattern)
	}
	return key == b.Pattern
}

// Snapshot is the complete set of controls and blocks at one moment.
type Snapshot struct {
	// Controls are the consumers' control rows, ordered by consumer.
	Controls []Control `json:"controls"`
	// Blocks are the blocked keys and prefixes, ordered by consumer and
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

// ErrInvalid reports an invalid consumer name, key or concurrency.
var ErrInvalid = errors.New("control: invalid argument")

func checkConsumer(name string) error {
	if !consumer.ValidName(name) {
		return fmt.Errorf("%w: consumer name %q", ErrInvalid, name)
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
	if err := checkConsumer(name); err != nil {
		return err
	}
	if _, err := s.db.Exec(ctx, upsertControl, name, paused, conc, opts.reason(), opts.by()); err != nil {
		return fmt.Errorf("control: update %s: %w", name, err)
	}
	return nil
}

// Pause marks consumer paused. Running workers whose [Watcher] controls it
// stop taking deliveries within the watcher's pickup time; in-flight work
// finishes and unacked deliveries stay in the queue.
func (s *Store) Pause(ctx context.Context, consumerName string, opts *ChangeOpts) error {
	t := true
	return s.setControl(ctx, consumerName, &t, nil, opts)
}

// Resume clears the pause of consumer.
func (s *Store) Resume(ctx context.Context, consumerName string, opts *ChangeOpts) error {
	f := false
	return s.setControl(ctx, consumerName, &f, nil, opts)
}

// SetConcurrency limits consumer to n concurrent deliveries per worker
// process; n = 0 restores the consumer's configured concurrency. A negative
// n is an error.
func (s *Store) SetConcurrency(ctx context.Context, consumerName string, n int, opts *ChangeOpts) error {
	if n < 0 {
		return fmt.Errorf("%w: concurrency %d is negative", ErrInvalid, n)
	}
	return s.setControl(ctx, consumerName, nil, &n, opts)
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
// b.Consumer. Blocking an already blocked pattern updates its reason.
func (s *Store) Block(ctx context.Context, b Block) error {
	if err := checkConsumer(b.Consumer); err != nil {
		return err
	}
	if b.Pattern == "" {
		return fmt.Errorf("%w: empty key or prefix", ErrInvalid)
	}
	if _, err := s.db.Exec(ctx, upsertBlock, b.Consumer, b.Pattern, b.Prefix, b.Reason, b.CreatedBy); err != nil {
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
// true) for consumer. It reports whether such a block existed.
func (s *Store) Unblock(ctx context.Context, consumerName, pattern string, prefix bool) (bool, error) {
	if err := checkConsumer(consumerName); err != nil {
		return false, err
	}
	tag, err := s.db.Exec(ctx, deleteBlock, consumerName, pattern, prefix)
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
		err := r.Scan(&c.Consumer, &c.Paused, &c.Concurrency, &c.Reason, &c.UpdatedBy, &c.UpdatedAt)
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
		err := r.Scan(&b.Consumer, &b.Pattern, &b.Prefix, &b.Reason, &b.CreatedBy, &b.CreatedAt)
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("control: list blocks: %w", err)
	}
	return &Snapshot{Controls: controls, Blocks: blocks}, nil
}

// Blocked reports the first block that matches key for consumer, read from
// the database now (the watcher answers the same question from memory).
func (s *Store) Blocked(ctx context.Context, consumerName, key string) (Block, bool, error) {
	rows, err := s.db.Query(ctx, `SELECT consumer, pattern, is_prefix, coalesce(reason, ''), created_by, created_at
		FROM inboxmq_blocks
		WHERE consumer = $1 AND ((NOT is_prefix AND pattern = $2) OR (is_prefix AND starts_with($2, pattern)))
		ORDER BY is_prefix, pattern LIMIT 1`, consumerName, key)
	if err != nil {
		return Block{}, false, fmt.Errorf("control: blocked: %w", err)
	}
	b, err := pgx.CollectExactlyOneRow(rows, func(r pgx.CollectableRow) (Block, error) {
		var b Block
		err := r.Scan(&b.Consumer, &b.Pattern, &b.Prefix, &b.Reason, &b.CreatedBy, &b.CreatedAt)
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
