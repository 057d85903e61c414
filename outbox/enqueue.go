package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/internal/envelope"
	"github.com/inboxmq/inboxmq/internal/outboxwire"
)

// Message is one outgoing AMQP message. The zero value is not valid: it
// needs a destination (Exchange and/or RoutingKey) and a stable identity (ID
// or IdempotencyKey).
type Message struct {
	// Exchange is the exchange to publish to. Empty means the default
	// exchange, where RoutingKey names the queue.
	Exchange string
	// RoutingKey is the routing key (the queue name on the default exchange).
	RoutingKey string
	// ID is the AMQP message id. It must be stable: the same for every run of
	// the handler that enqueues the message, so a re-run or a relay crash
	// only ever produces a duplicate the receiver's inbox absorbs. Empty
	// means DeriveID(Exchange, RoutingKey, IdempotencyKey). It is never
	// random.
	ID string
	// IdempotencyKey is the business identity of the message. It is sent in
	// the header x-idempotency-key (inboxtype.HeaderIdempotencyKey) and,
	// when ID is empty, the message id is derived from it. Empty means no
	// such header (ID must then be set).
	IdempotencyKey string
	// OrderingKey groups messages that must go out in order (typically the
	// aggregate's id): the relay publishes the messages of one key one at a
	// time, in enqueue order, each only after the previous one was
	// confirmed, so a message that cannot be published yet (it backs off
	// and is retried) holds its key's later messages back. Empty means no
	// ordering constraint.
	OrderingKey string
	// ContentType is the AMQP content type. Empty means none.
	ContentType string
	// Headers are extra AMQP headers. Nil means none. Enqueue adds the W3C
	// trace context (traceparent, tracestate) when ctx carries a span and
	// the headers have no traceparent yet.
	Headers amqp.Table
	// Body is the payload. Nil is stored as empty.
	Body []byte
}

// DeriveID returns the message id derived from an idempotency key and the
// destination: a UUID-formatted SHA-256 of the three, so the same key sent
// to two destinations gets two ids, and the same key sent again to the same
// destination gets the same id. Package producer derives its message ids
// the same way, so a message published directly and one published through
// the outbox carry the same id for the same key and destination.
func DeriveID(exchange, routingKey, key string) string {
	return envelope.DeriveID(exchange, routingKey, key)
}

// row is a validated Message ready for the INSERT.
type row struct {
	id, exchange, routingKey, contentType string
	orderingKey, idempotencyKey           *string
	headers, body                         []byte
}

func prepare(ctx context.Context, m Message) (row, error) {
	if m.Exchange == "" && m.RoutingKey == "" {
		return row{}, ErrNoDestination
	}
	id := m.ID
	if id == "" {
		if m.IdempotencyKey == "" {
			return row{}, ErrNoID
		}
		id = DeriveID(m.Exchange, m.RoutingKey, m.IdempotencyKey)
	}
	headers, err := outboxwire.EncodeHeaders(envelope.Headers(ctx, m.Headers, m.IdempotencyKey))
	if err != nil {
		return row{}, err
	}
	r := row{id: id, exchange: m.Exchange, routingKey: m.RoutingKey, contentType: m.ContentType, headers: headers, body: m.Body}
	if r.body == nil {
		r.body = []byte{}
	}
	if m.OrderingKey != "" {
		k := m.OrderingKey // not &m.OrderingKey: m would move to the heap
		r.orderingKey = &k
	}
	if m.IdempotencyKey != "" {
		k := m.IdempotencyKey
		r.idempotencyKey = &k
	}
	return r, nil
}

const notifySQL = `SELECT pg_notify('` + outboxwire.NotifyChannel + `', current_schema())`

// Enqueue writes msg to the outbox in the caller's transaction tx; an
// inboxmq.Worker's relay publishes it once tx commits, and if tx rolls
// back nothing is published. The relays are woken by a NOTIFY that
// PostgreSQL delivers only on commit (in a Worker's handler, none: the
// Worker wakes its own relay in-process when the delivery's transaction
// ends).
//
// Enqueueing a message id that is already in the outbox is a no-op, so a
// handler that runs twice enqueues once (while the first row is retained).
// ctx governs the statements and supplies the trace context.
func Enqueue(ctx context.Context, tx pgx.Tx, msg Message) error {
	return EnqueueBatch(ctx, tx, []Message{msg})
}

// EnqueueBatch is Enqueue for several messages at once, cheaper than one
// Enqueue each. It validates every message before writing any; an empty
// batch does nothing.
func EnqueueBatch(ctx context.Context, tx pgx.Tx, msgs []Message) error {
	if len(msgs) == 0 {
		return nil
	}
	rows := make([]row, len(msgs))
	for i, m := range msgs {
		r, err := prepare(ctx, m)
		if err != nil {
			return fmt.Errorf("outbox: message %d: %w", i, err)
		}
		rows[i] = r
	}
	b := &pgx.Batch{}
	queueRows(ctx, b, rows)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("outbox: enqueue: %w", err)
	}
	return nil
}

// AddToBatch is Enqueue for a handler that sends its own writes as one
// [pgx.Batch]: it appends the statements that enqueue msgs to b, so the
// business writes and the outbox rows travel together, in one round trip
// to PostgreSQL instead of one for the writes and one for Enqueue. Send b
// with SendBatch on the transaction whose commit should enqueue the
// messages (inside transactional mode's handler, its tx), and read or
// close its results as usual: the messages are enqueued, and the relays
// woken, only if that transaction commits.
//
// It validates every message before adding anything to b; on an error b
// is unchanged. Like Enqueue, a message id already in the outbox is a
// no-op. ctx supplies the trace context of the messages' headers. The
// statements it adds return no rows; they are the last ones in b unless
// the caller queues more after them.
func AddToBatch(ctx context.Context, b *pgx.Batch, msgs ...Message) error {
	if b == nil {
		return errors.New("outbox: AddToBatch: nil batch")
	}
	if len(msgs) == 0 {
		return nil
	}
	rows := make([]row, len(msgs))
	for i, m := range msgs {
		r, err := prepare(ctx, m)
		if err != nil {
			return fmt.Errorf("outbox: message %d: %w", i, err)
		}
		rows[i] = r
	}
	queueRows(ctx, b, rows)
	return nil
}

// queueRows appends the inserts of rows and the NOTIFY to b (none under
// the relay's WakeLocally: the worker wakes its relay after the commit). The
// arguments point into rows (pgx reads through pointers): a pointer goes
// into an interface without the allocation a string or a slice costs.
func queueRows(ctx context.Context, b *pgx.Batch, rows []row) {
	for i := range rows {
		r := &rows[i]
		b.Queue(outboxwire.InsertSQL, &r.id, &r.exchange, &r.routingKey, &r.headers, &r.contentType, &r.body, r.orderingKey, r.idempotencyKey)
	}
	if !outboxwire.SkipNotify(ctx) {
		b.Queue(notifySQL)
	}
}
