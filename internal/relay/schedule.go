package relay

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/internal/envelope"
	"github.com/inboxmq/inboxmq/internal/outboxwire"
)

// scheduleSQL writes a retry due in $7 seconds. The row is named by the
// delivery and its attempt ($1): a delivery that fails again after a crash
// before its ack schedules the same row, and a pending row is left as it
// is (it goes out once). A sent row of that name (a deferral repeats its
// attempt) is taken up again. created_at is the due time, so the relay's
// lag metric (sent_at − created_at) is how late the retry went out.
const scheduleSQL = `INSERT INTO inboxmq_outbox AS o
	(message_id, routing_key, headers, content_type, body, properties, available_at, created_at)
SELECT $1, $2, $3, $4, $5, $6, t.due, t.due FROM (SELECT clock_timestamp() + make_interval(secs => $7) AS due) t
ON CONFLICT (message_id) DO UPDATE SET
	headers = EXCLUDED.headers, content_type = EXCLUDED.content_type, body = EXCLUDED.body,
	properties = EXCLUDED.properties, available_at = EXCLUDED.available_at, created_at = EXCLUDED.created_at,
	attempts = 0, last_error = NULL, sent_at = NULL
WHERE o.sent_at IS NOT NULL`

// Schedule writes msg to the outbox, to be published to queue (on the
// default exchange) once delay has passed, with msg's properties; the
// relay then publishes it with confirms, from whichever worker's relay
// claims it first. attempt names the row together with msg's message id:
// scheduling the same message and attempt again while its row is pending
// does nothing.
//
// It returns an error, and writes nothing, when the database does not
// answer or the outbox table has no properties column (the migrations have
// not run): the caller then falls back to the broker's delay queues.
func (r *Relay) Schedule(ctx context.Context, queue string, attempt int, delay time.Duration, msg *amqp.Publishing) error {
	if !r.props.Load() {
		return errNoProperties
	}
	headers, err := outboxwire.EncodeHeaders(msg.Headers)
	if err != nil {
		return fmt.Errorf("relay: schedule: %w", err)
	}
	props, err := outboxwire.EncodeProperties(msg)
	if err != nil {
		return fmt.Errorf("relay: schedule: %w", err)
	}
	body := msg.Body
	if body == nil {
		body = []byte{}
	}
	id := "retry-" + rand.Text() // no message id: nothing to name the row by
	if msg.MessageId != "" {
		id = envelope.DeriveID("", "retry:"+queue, msg.MessageId+"\x00"+strconv.Itoa(attempt))
	}
	if _, err := r.pool.Exec(ctx, scheduleSQL, id, queue, headers, msg.ContentType, body, props, delay.Seconds()); err != nil {
		r.checkProperties(ctx, err)
		return fmt.Errorf("relay: schedule: %w", err)
	}
	// The lanes poll every PollInterval: a timer wakes one when the row
	// is due, so the retry goes out on time.
	time.AfterFunc(max(delay, 0), func() { notify(r.wake) })
	return nil
}

// scheduledNackMaxDelay bounds the pause before a scheduled retry that
// the broker refused is published again.
const scheduledNackMaxDelay = 2 * time.Second

var errNoProperties = errors.New("relay: the outbox table has no properties column (run the migrations)")

// checkProperties turns scheduling off, once, when err says that the
// outbox table has no properties column: the claims then leave it out.
func (r *Relay) checkProperties(ctx context.Context, err error) {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42703" || !r.props.CompareAndSwap(true, false) {
		return
	}
	r.log.LogAttrs(ctx, slog.LevelWarn, "outbox relay: the outbox table has no properties column (run the migrations): "+
		"retries wait in the broker's delay queues", slog.Any("error", err))
}

// claimSQL is the claim for the table as it is: without the properties
// column (before migration 00008), the claim reads NULL in its place.
func (r *Relay) claimSQL() string {
	if r.props.Load() {
		return claimSQL
	}
	return claimSQLWithoutProperties
}
