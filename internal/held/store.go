package held

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/internal/outboxwire"
)

// HeaderSeq marks a message that a release published again: its place
// among its key's held messages. A delivery carrying the seq the key is
// releasing runs; the others of a held key are parked.
const HeaderSeq = "x-held-seq"

// States of a held key.
const (
	StateHeld      = "held"      // waiting for an operator
	StateReleasing = "releasing" // its messages go back one at a time
)

// ErrNotHeld reports a key that is not held (or no longer).
var ErrNotHeld = errors.New("held: the key is not held")

// ErrReleasing reports a release or skip of a key that is already being
// released.
var ErrReleasing = errors.New("held: the key is already being released")

// DB is what the store needs of a *pgxpool.Pool.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Store keeps the held keys of strict ordered routes and their parked
// messages in PostgreSQL (tables inboxmq_held_keys and
// inboxmq_held_messages). Every change of one key locks its row, so the
// worker running the key's messages and an operator releasing it take
// turns.
type Store struct{ db DB }

// NewStore returns a store on db.
func NewStore(db DB) *Store { return &Store{db: db} }

// Key is one held ordering key, as operators see it.
type Key struct {
	Namespace     string    `json:"namespace"`
	Key           string    `json:"key"`
	Queue         string    `json:"queue"`
	State         string    `json:"state"`
	HeadMessageID string    `json:"head_message_id,omitempty"`
	HeadKey       string    `json:"head_key,omitempty"`
	HeadParked    bool      `json:"head_parked"` // the head's copy waits to run again
	Reason        string    `json:"reason"`
	LastError     string    `json:"last_error,omitempty"`
	Parked        int       `json:"parked"` // messages waiting, the head's copy included
	HeldAt        time.Time `json:"held_at"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// Age is how long the key has been held.
func (k Key) Age(now time.Time) time.Duration { return now.Sub(k.HeldAt) }

// state is what a delivery of a strict route needs to know of its key.
type state struct {
	state       string
	headMsgID   string
	headKey     string
	headParked  bool
	releasedSeq int64
}

// isHead reports whether a message with this message id or idempotency
// key (a dead letter's header) is the key's dead-lettered head: a replay
// of it, or the original come back (a crash before its ack).
func (s state) isHead(msgID, idemKey string) bool {
	return (s.headKey != "" && idemKey == s.headKey) || (msgID != "" && msgID == s.headMsgID)
}

// Check reports an error that names the fix when the held-key tables are
// missing (migration 00009 has not run).
func (s *Store) Check(ctx context.Context) error {
	if _, err := s.db.Exec(ctx, `SELECT 1 FROM inboxmq_held_keys, inboxmq_held_messages LIMIT 0`); err != nil {
		return fmt.Errorf("held: a strict ordered route needs the tables inboxmq_held_keys and inboxmq_held_messages "+
			"(schema version 9: run the migrations, inboxctl migrate): %w", err)
	}
	return nil
}

const getSQL = `SELECT state, head_message_id, head_key, head_seq IS NOT NULL, coalesce(released_seq, 0)
FROM inboxmq_held_keys WHERE consumer = $1 AND ordering_key = $2`

// get reads the state of a key; ok is false when it is not held.
func (s *Store) get(ctx context.Context, q rowQuerier, ns, key string, lock bool) (st state, ok bool, err error) {
	query := getSQL
	if lock {
		query += " FOR UPDATE"
	}
	err = q.QueryRow(ctx, query, ns, key).Scan(&st.state, &st.headMsgID, &st.headKey, &st.headParked, &st.releasedSeq)
	if errors.Is(err, pgx.ErrNoRows) {
		return state{}, false, nil
	}
	if err != nil {
		return state{}, false, fmt.Errorf("held: read key %q: %w", key, err)
	}
	return st, true, nil
}

type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// message is a message as a held row keeps it.
type message struct {
	headers, props []byte
	contentType    string
	body           []byte
}

func encode(pub *amqp.Publishing) (message, error) {
	h, err := outboxwire.EncodeHeaders(pub.Headers)
	if err != nil {
		return message{}, fmt.Errorf("held: %w", err)
	}
	p, err := outboxwire.EncodeProperties(pub)
	if err != nil {
		return message{}, fmt.Errorf("held: %w", err)
	}
	body := pub.Body
	if body == nil {
		body = []byte{}
	}
	return message{headers: h, props: p, contentType: pub.ContentType, body: body}, nil
}

const insertMessageSQL = `INSERT INTO inboxmq_held_messages (consumer, ordering_key, seq, headers, properties, content_type, body)
VALUES ($1, $2, $3, $4, $5, $6, $7)`

// parkSQL appends a message to a held key's line, if the key is held.
const parkSQL = `WITH k AS (
	UPDATE inboxmq_held_keys SET next_seq = next_seq + 1, updated_at = now()
	WHERE consumer = $1 AND ordering_key = $2
	RETURNING next_seq - 1 AS seq
)
INSERT INTO inboxmq_held_messages (consumer, ordering_key, seq, headers, properties, content_type, body)
SELECT $1, $2, k.seq, $3, $4, $5, $6 FROM k`

// park appends pub to the line of key if key is held, and reports whether
// it did: a key released in the meantime parks nothing.
func (s *Store) park(ctx context.Context, ns, key string, pub *amqp.Publishing) (bool, error) {
	m, err := encode(pub)
	if err != nil {
		return false, err
	}
	tag, err := s.db.Exec(ctx, parkSQL, ns, key, m.headers, m.props, m.contentType, m.body)
	if err != nil {
		return false, fmt.Errorf("held: park a message of key %q: %w", key, err)
	}
	return tag.RowsAffected() == 1, nil
}

// DeadLetter is a dead letter of a strict ordered route.
type DeadLetter struct {
	Namespace, Queue, Exchange string
	// Key is the ordering key.
	Key string
	// MessageID and IdempotencyKey name the message ("" when it had none).
	MessageID, IdempotencyKey string
	// Seq is the message's HeaderSeq (0 when it has none).
	Seq int64
	// Reason and Error say why it was dead-lettered.
	Reason, Error string
	// Copy is the message as a replay of its dead letter would publish it.
	Copy *amqp.Publishing
}

// holdSQL holds a key with its dead-lettered head as seq 1.
const holdSQL = `INSERT INTO inboxmq_held_keys
	(consumer, ordering_key, queue, exchange, head_seq, next_seq, head_message_id, head_key, reason, last_error)
VALUES ($1, $2, $3, $4, 1, 2, $5, $6, $7, $8)`

// reholdSQL holds a releasing key again: the message out for its run
// (seq $3) was dead-lettered, and becomes the head again, at its place.
const reholdSQL = `UPDATE inboxmq_held_keys SET state = 'held', head_seq = $3, released_seq = NULL,
	head_message_id = $4, head_key = $5, reason = $6, last_error = $7, updated_at = now()
WHERE consumer = $1 AND ordering_key = $2`

const failedAgainSQL = `UPDATE inboxmq_held_keys SET reason = $3, last_error = $4, updated_at = now()
WHERE consumer = $1 AND ordering_key = $2`

// Hold records a dead letter of a strict ordered route, before the
// original is acked: the key is held, with a copy of the message as its
// head; or, when the key was being released and this was the message out
// for its run, held again with it as the head; or, when it was the head
// itself failing again (a replay of it, a dead-letter hook that failed),
// the key keeps its head with the new error. A dead letter of a held key
// that is none of these is parked behind the others. It is idempotent for
// one dead letter.
func (s *Store) Hold(ctx context.Context, dl DeadLetter) error {
	m, err := encode(dl.Copy)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		st, ok, err := s.get(ctx, tx, dl.Namespace, dl.Key, true)
		if err != nil {
			return err
		}
		switch {
		case !ok:
			if _, err := tx.Exec(ctx, holdSQL, dl.Namespace, dl.Key, dl.Queue, dl.Exchange,
				dl.MessageID, dl.IdempotencyKey, dl.Reason, dl.Error); err != nil {
				return fmt.Errorf("held: hold key %q: %w", dl.Key, err)
			}
			_, err = tx.Exec(ctx, insertMessageSQL, dl.Namespace, dl.Key, 1, m.headers, m.props, m.contentType, m.body)
		case st.state == StateReleasing && dl.Seq != 0 && dl.Seq == st.releasedSeq:
			if _, err := tx.Exec(ctx, reholdSQL, dl.Namespace, dl.Key, dl.Seq,
				dl.MessageID, dl.IdempotencyKey, dl.Reason, dl.Error); err != nil {
				return fmt.Errorf("held: hold key %q again: %w", dl.Key, err)
			}
			_, err = tx.Exec(ctx, insertMessageSQL, dl.Namespace, dl.Key, dl.Seq, m.headers, m.props, m.contentType, m.body)
		case st.state == StateHeld && st.isHead(dl.MessageID, dl.IdempotencyKey):
			_, err = tx.Exec(ctx, failedAgainSQL, dl.Namespace, dl.Key, dl.Reason, dl.Error)
		default:
			_, err = tx.Exec(ctx, parkSQL, dl.Namespace, dl.Key, m.headers, m.props, m.contentType, m.body)
		}
		if err != nil {
			return fmt.Errorf("held: hold key %q: %w", dl.Key, err)
		}
		return nil
	})
}

// advance moves a releasing key on after the run of its message seq
// ended in a commit or a duplicate: the next parked message goes out, or
// the hold ends. A seq that is not the one out (a redelivery of an
// earlier one) changes nothing.
func (s *Store) advance(ctx context.Context, ns, key string, seq int64) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		st, ok, err := s.get(ctx, tx, ns, key, true)
		if err != nil || !ok || st.state != StateReleasing || st.releasedSeq != seq {
			return err
		}
		return releaseNext(ctx, tx, ns, key)
	})
}

// headRan moves a held key on after a replay of its head (from the DLQ)
// committed or was a duplicate: the head's parked copy is dropped and the
// key is released.
func (s *Store) headRan(ctx context.Context, ns, key, msgID, idemKey string) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		st, ok, err := s.get(ctx, tx, ns, key, true)
		if err != nil || !ok || st.state != StateHeld || !st.isHead(msgID, idemKey) {
			return err
		}
		if err := dropHead(ctx, tx, ns, key); err != nil {
			return err
		}
		return releaseNext(ctx, tx, ns, key)
	})
}

// Release starts the release of a held key: its head's copy runs again
// first, then each later message in order, one at a time; the hold ends
// after the last. If the head fails for good again, the key is held again.
func (s *Store) Release(ctx context.Context, ns, key string) error {
	return s.operate(ctx, ns, key, false)
}

// Skip drops a held key's head (its dead letter stays in the DLQ) and
// releases the key's later messages as [Store.Release] does.
func (s *Store) Skip(ctx context.Context, ns, key string) error {
	return s.operate(ctx, ns, key, true)
}

func (s *Store) operate(ctx context.Context, ns, key string, skip bool) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		st, ok, err := s.get(ctx, tx, ns, key, true)
		switch {
		case err != nil:
			return err
		case !ok:
			return fmt.Errorf("%w: %s %q", ErrNotHeld, ns, key)
		case st.state == StateReleasing:
			return fmt.Errorf("%w: %s %q", ErrReleasing, ns, key)
		}
		if skip {
			if err := dropHead(ctx, tx, ns, key); err != nil {
				return err
			}
		}
		return releaseNext(ctx, tx, ns, key)
	})
}

func dropHead(ctx context.Context, tx pgx.Tx, ns, key string) error {
	_, err := tx.Exec(ctx, `DELETE FROM inboxmq_held_messages m USING inboxmq_held_keys k
WHERE k.consumer = $1 AND k.ordering_key = $2 AND m.consumer = k.consumer AND m.ordering_key = k.ordering_key AND m.seq = k.head_seq`, ns, key)
	if err == nil {
		_, err = tx.Exec(ctx, `UPDATE inboxmq_held_keys SET head_seq = NULL WHERE consumer = $1 AND ordering_key = $2`, ns, key)
	}
	if err != nil {
		return fmt.Errorf("held: drop the head of key %q: %w", key, err)
	}
	return nil
}

// takeNextSQL takes the first parked message of a key off its line.
const takeNextSQL = `DELETE FROM inboxmq_held_messages
WHERE (consumer, ordering_key, seq) = (
	SELECT consumer, ordering_key, seq FROM inboxmq_held_messages
	WHERE consumer = $1 AND ordering_key = $2 ORDER BY seq LIMIT 1)
RETURNING seq, headers, properties, content_type, body`

// releaseSQL writes a released message to the outbox, to be published
// through the route's exchange to the key's shard, with the properties it
// arrived with; the relay's NOTIFY goes with the commit.
const releaseSQL = `WITH k AS (
	UPDATE inboxmq_held_keys SET state = 'releasing', released_seq = $3,
		head_seq = CASE WHEN head_seq = $3 THEN NULL ELSE head_seq END, updated_at = now()
	WHERE consumer = $1 AND ordering_key = $2
	RETURNING exchange
), o AS (
	INSERT INTO inboxmq_outbox (message_id, exchange, routing_key, headers, content_type, body, properties)
	SELECT $4, k.exchange, $2, $5, $6, $7, $8 FROM k
)
SELECT pg_notify('` + outboxwire.NotifyChannel + `', current_schema())`

// releaseNext sends the first parked message of a key out for its run, or
// ends the hold when none is left.
func releaseNext(ctx context.Context, tx pgx.Tx, ns, key string) error {
	var (
		seq int64
		m   message
	)
	err := tx.QueryRow(ctx, takeNextSQL, ns, key).Scan(&seq, &m.headers, &m.props, &m.contentType, &m.body)
	if errors.Is(err, pgx.ErrNoRows) {
		if _, err := tx.Exec(ctx, `DELETE FROM inboxmq_held_keys WHERE consumer = $1 AND ordering_key = $2`, ns, key); err != nil {
			return fmt.Errorf("held: end the hold of key %q: %w", key, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("held: take the next message of key %q: %w", key, err)
	}
	h, err := outboxwire.DecodeHeaders(m.headers)
	if err != nil {
		return fmt.Errorf("held: message %d of key %q: %w", seq, key, err)
	}
	if h == nil {
		h = amqp.Table{}
	}
	h[HeaderSeq] = seq
	if m.headers, err = outboxwire.EncodeHeaders(h); err != nil {
		return fmt.Errorf("held: message %d of key %q: %w", seq, key, err)
	}
	if _, err := tx.Exec(ctx, releaseSQL, ns, key, seq, "held-"+rand.Text(), m.headers, m.contentType, m.body, m.props); err != nil {
		return fmt.Errorf("held: release message %d of key %q: %w", seq, key, err)
	}
	return nil
}

const listSQL = `SELECT k.consumer, k.ordering_key, k.queue, k.state, k.head_message_id, k.head_key,
	k.head_seq IS NOT NULL, k.reason, k.last_error,
	(SELECT count(*) FROM inboxmq_held_messages m WHERE m.consumer = k.consumer AND m.ordering_key = k.ordering_key)::int,
	k.held_at, k.updated_at
FROM inboxmq_held_keys k
WHERE $1 = '' OR k.consumer = $1
ORDER BY k.held_at, k.consumer, k.ordering_key`

// List returns the held keys of namespace ("" for every namespace),
// oldest first.
func (s *Store) List(ctx context.Context, namespace string) ([]Key, error) {
	rows, err := s.db.Query(ctx, listSQL, namespace)
	if err != nil {
		return nil, fmt.Errorf("held: list: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Key, error) {
		var k Key
		err := r.Scan(&k.Namespace, &k.Key, &k.Queue, &k.State, &k.HeadMessageID, &k.HeadKey,
			&k.HeadParked, &k.Reason, &k.LastError, &k.Parked, &k.HeldAt, &k.UpdatedAt)
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("held: list: %w", err)
	}
	return keys, nil
}
