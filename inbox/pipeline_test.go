package inbox_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

func pipelinedBatch(n int) *inbox.HandlerOpts {
	return &inbox.HandlerOpts{GroupCommit: &inbox.GroupCommit{MaxBatch: n, MaxWait: time.Minute, MaxInFlight: 1, Pipeline: true}}
}

func orders(t *testing.T, n int) []*inboxtype.Message[order] {
	t.Helper()
	msgs := make([]*inboxtype.Message[order], n)
	for i := range msgs {
		msgs[i] = newMsg(t, "payments", order{OrderID: strconv.Itoa(i + 1), Amount: i + 1}, false)
	}
	return msgs
}

// A pipelined batch commits every delivery once, in one transaction, and
// runs each handler once.
func TestPipeline_CommitsEveryDeliveryOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var calls atomic.Int64
	h := inbox.Handler(b.store, effectHandler(&calls), pipelinedBatch(16))
	for _, err := range handleAll(t, h, orders(t, 16)) {
		require.NoError(t, err)
	}
	require.Equal(t, int64(16), calls.Load(), "no re-run when nothing fails")
	require.Equal(t, 16, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, 16, b.count(t, `SELECT count(*) FROM ledger`))
	require.Equal(t, 16, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE status = 'completed'`))
	require.Equal(t, 1, b.count(t, `SELECT count(DISTINCT xmin::text) FROM effects`), "one transaction")
}

// A handler error aborts the optimistic attempt: the batch runs again with
// savepoints, the failing delivery alone is rolled back and recorded, the
// others commit exactly once.
func TestPipeline_FailureFallsBackToSavepoints(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var calls atomic.Int64
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if err := effectHandler(&calls)(ctx, tx, msg); err != nil {
			return err
		}
		if msg.Body.OrderID == "3" {
			return retry.Permanent(errors.New("card declined"))
		}
		return nil
	}, pipelinedBatch(6))
	errs := handleAll(t, h, orders(t, 6))
	for i, err := range errs {
		if i == 2 {
			require.ErrorContains(t, err, "card declined")
			continue
		}
		require.NoError(t, err)
	}
	require.Equal(t, 5, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:3'`))
	require.Equal(t, inbox.RecordFailed, b.get(t, "payments", "order:3").Status)
	require.Equal(t, int64(12), calls.Load(), "the optimistic attempt, then the serial one")
}

// A failed statement (a business unique violation) aborts the attempt too;
// in the serial run that delivery alone is a business duplicate.
func TestPipeline_FailedStatementFallsBack(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, err := b.pool.Exec(t.Context(), `INSERT INTO orders (order_id) VALUES ('2')`)
	require.NoError(t, err)
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (order_id) VALUES ($1)`, msg.Body.OrderID); err != nil {
			return err
		}
		return effectHandler(nil)(ctx, tx, msg)
	}, pipelinedBatch(4))
	errs := handleAll(t, h, orders(t, 4))
	for i, err := range errs {
		if i == 1 {
			require.Equal(t, retry.SourceBusiness, retry.Classify(err).Source)
			continue
		}
		require.NoError(t, err)
	}
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:2'`))
}

// A handler that calls what a pipeline cannot carry (a savepoint of its
// own, the connection) cannot be pipelined: the batch runs with savepoints
// and still commits every delivery once.
func TestPipeline_NonPipelinableCallFallsBack(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if err := sp.Commit(ctx); err != nil {
			return err
		}
		return effectHandler(nil)(ctx, tx, msg)
	}, pipelinedBatch(5))
	for _, err := range handleAll(t, h, orders(t, 5)) {
		require.NoError(t, err)
	}
	require.Equal(t, 5, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, 5, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE status = 'completed'`))
}

// Duplicates inside a pipelined batch are detected as in the other modes.
func TestPipeline_DuplicatesInsideOneBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := inbox.Handler(b.store, effectHandler(nil), pipelinedBatch(6))
	var msgs []*inboxtype.Message[order]
	for _, id := range []string{"a", "b", "a", "c", "b", "a"} {
		msgs = append(msgs, newMsg(t, "payments", order{OrderID: id}, false))
	}
	var dup int
	for _, err := range handleAll(t, h, msgs) {
		if err != nil {
			require.ErrorIs(t, err, retry.ErrDuplicate)
			dup++
		}
	}
	require.Equal(t, 3, dup)
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM effects`))
}
