package relay

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/outbox"
)

// TestAddToBatchWritesWithTheBusinessRowsAndIsRelayed sends a business
// insert and an outbox message in one batch: both commit, the relay
// publishes the message, and a batch whose transaction rolls back
// publishes nothing.
func TestAddToBatchWritesWithTheBusinessRowsAndIsRelayed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	_, err := b.pool.Exec(ctx, "CREATE TABLE biz (id text PRIMARY KEY)")
	require.NoError(t, err)

	send := func(id string, fail bool) error {
		return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			batch := &pgx.Batch{}
			batch.Queue("INSERT INTO biz (id) VALUES ($1)", id)
			if err := outbox.AddToBatch(ctx, batch, msgTo(b.queue, id)); err != nil {
				return err
			}
			require.Equal(t, 3, batch.Len(), "the business insert, the outbox insert and the NOTIFY")
			if err := tx.SendBatch(ctx, batch).Close(); err != nil {
				return err
			}
			if fail {
				return errors.New("business rule failed")
			}
			return nil
		})
	}
	require.Error(t, send("rolled-back", true))
	require.NoError(t, send("committed", false))
	// The same message again (a re-run) is a no-op in the outbox.
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		batch := &pgx.Batch{}
		require.NoError(t, outbox.AddToBatch(ctx, batch, msgTo(b.queue, "committed")))
		return tx.SendBatch(ctx, batch).Close()
	}))

	var bizRows int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM biz").Scan(&bizRows))
	require.Equal(t, 1, bizRows)

	r, _ := b.newRelay(t, nil)
	start(t, r)
	waitAllSent(t, b.pool, 1)
	got := amqptest.Drain(t, b.conn, b.queue)
	require.Len(t, got, 1)
	require.Equal(t, "committed", string(got[0].Body))
	require.Equal(t, outbox.DeriveID("", b.queue, "committed"), got[0].MessageId)
}
