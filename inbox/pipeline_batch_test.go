package inbox_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
)

// A handler that writes through a pgx.Batch with a RETURNING row, reads a
// row with QueryRow and stores a result is pipelined: one attempt (no
// re-run), one transaction, each handler reading its own returned values,
// and the whole batch of 16 in 4 round trips — BEGIN + claim, every
// handler's batch, every handler's QueryRow, and the results with COMMIT.
func TestPipeline_BatchesAndReadsArePipelined(t *testing.T) {
	t.Parallel()
	tr := &countingTracer{}
	b := setupOn(t, tracedPool(t, tr), nil)
	var calls atomic.Int64
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		calls.Add(1)
		batch := &pgx.Batch{}
		batch.Queue(`INSERT INTO ledger (key) VALUES ($1)`, msg.Key)
		batch.Queue(`INSERT INTO effects (key, amount) VALUES ($1, $2) RETURNING id, amount`, msg.Key, msg.Body.Amount)
		br := tx.SendBatch(ctx, batch)
		if _, err := br.Exec(); err != nil {
			return err
		}
		var id int64
		var amount int
		if err := br.QueryRow().Scan(&id, &amount); err != nil {
			return err
		}
		if err := br.Close(); err != nil {
			return err
		}
		var key string
		if err := tx.QueryRow(ctx, `SELECT key FROM effects WHERE id = $1`, id).Scan(&key); err != nil {
			return err
		}
		return msg.SetResult(paymentResult{PaymentID: id, Order: key + ":" + msg.Body.OrderID})
	}, pipelinedBatch(16))

	msgs := orders(t, 16)
	before := tr.n.Load()
	for _, err := range handleAll(t, h, msgs) {
		require.NoError(t, err)
	}
	require.Equal(t, int64(4), tr.n.Load()-before, "round trips of the batch")
	require.Equal(t, int64(16), calls.Load(), "no re-run: the attempt was pipelined")
	require.Equal(t, 1, b.count(t, `SELECT count(DISTINCT xmin::text) FROM effects`), "one transaction")
	for _, m := range msgs {
		stored := decodeResult(t, b.get(t, "payments", m.Key).Result)
		require.Equal(t, m.Key+":"+m.Body.OrderID, stored.Order, "each handler read its own row")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE id = $1 AND key = $2 AND amount = $3`,
			stored.PaymentID, m.Key, m.Body.Amount))
	}
	require.Equal(t, 16, b.count(t, `SELECT count(*) FROM ledger`))
}
