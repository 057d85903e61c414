package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"
)

// The hand-written claim-mode protocol of case (g): what (f) does, written
// directly against amqp091, pgx and go-redis, as its ceiling.
const (
	// The claim: a processing row with an owner token, a fence and a
	// lease, committed asynchronously.
	sqlClaim = `INSERT INTO inboxmq_inbox AS i (consumer, key, status, owner, fence, lease_until, attempts, fingerprint, message_id)
VALUES ($1, $2, 'processing', $3, 1, now() + interval '30 seconds', 1, $4, $5)
ON CONFLICT (consumer, key) DO UPDATE SET status = 'processing', owner = EXCLUDED.owner, fence = i.fence + 1,
	lease_until = EXCLUDED.lease_until, attempts = i.attempts + 1, updated_at = now()
WHERE i.status IN ('received', 'failed', 'dead') OR (i.status = 'processing' AND i.lease_until <= now())
RETURNING fence, set_config('synchronous_commit', 'off', true)`
	// The fenced completion, in the business transaction.
	sqlComplete = `UPDATE inboxmq_inbox SET status = 'completed', owner = NULL, lease_until = NULL, completed_at = now(), updated_at = now()
WHERE consumer = $1 AND key = $2 AND owner = $3 AND fence = $4 AND status = 'processing'`
)

var errFenced = errors.New("inboxbench: claim taken over")

// claimLoop is case (g): per delivery a claim committed on its own, then
// one transaction whose first round trip carries BEGIN, the fenced
// completion and the first business insert, `workers` handlers. It sends
// the round trips (f) sends, each alone: 4 to PostgreSQL and an ack.
func claimLoop(e *env, workers int) runner { return deliveryLoop(e, workers, handleClaimed) }

func handleClaimed(ctx context.Context, e *env, d amqp.Delivery) error {
	var p payment
	if err := json.Unmarshal(d.Body, &p); err != nil {
		return err
	}
	key := "payment:" + p.OrderID
	var tok [16]byte
	_, _ = rand.Read(tok[:])
	token := hex.EncodeToString(tok[:])

	fp := sha256.Sum256(d.Body)
	var claimFence int64
	if err := e.pool.QueryRow(ctx, sqlClaim, benchConsumer, key, token, fp[:], d.MessageId).Scan(&claimFence, nil); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // completed or held: a duplicate here
		}
		return err
	}
	// (the outside call, carrying key as Idempotency-Key, goes here)

	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var b pgx.Batch
	b.Queue("BEGIN")
	b.Queue(sqlComplete, benchConsumer, key, token, claimFence)
	b.Queue(sqlPayment, p.OrderID, p.AmountCents, p.Currency)
	br := conn.SendBatch(ctx, &b)
	_, err = br.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if err == nil && tag.RowsAffected() != 1 {
		err = errFenced
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		_, err = conn.Exec(ctx, sqlLedger, p.OrderID, p.AmountCents)
	}
	if err != nil {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		return err
	}
	_, err = conn.Exec(ctx, "COMMIT")
	return err
}
