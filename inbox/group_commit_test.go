package inbox_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// fullBatch makes a batch of exactly n: it only closes when n deliveries
// arrived (the long MaxWait is never reached in a passing test).
func fullBatch(n int) *inbox.GroupCommit {
	return &inbox.GroupCommit{MaxBatch: n, MaxWait: time.Minute, MaxInFlight: 1}
}

// handleAll runs h on msgs concurrently and returns their errors in order.
func handleAll(t *testing.T, h inboxtype.Handler[order], msgs []*inboxtype.Message[order]) []error {
	t.Helper()
	errs := make([]error, len(msgs))
	var wg sync.WaitGroup
	for i, m := range msgs {
		wg.Go(func() { errs[i] = h.Handle(t.Context(), m) })
	}
	wg.Wait()
	return errs
}

// requireOnlyRetry asserts that errs[bad] asks for a retry, with reason
// if not empty, and that every other delivery succeeded.
func requireOnlyRetry(t *testing.T, errs []error, bad int, reason string) {
	t.Helper()
	for i, err := range errs {
		if i != bad {
			require.NoError(t, err, "delivery %d", i)
			continue
		}
		d := retry.Classify(err)
		require.Equal(t, retry.KindRetry, d.Kind, "%v", err)
		if reason != "" {
			require.Equal(t, reason, d.Reason)
		}
	}
}

func TestGroupCommit_FailureInTheMiddleRollsBackOnlyItsSavepoint(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var mu sync.Mutex
	txids := map[string]int64{}
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		var txid int64
		if err := tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&txid); err != nil {
			return err
		}
		mu.Lock()
		txids[msg.Key] = txid
		mu.Unlock()
		if err := effectHandler(nil)(ctx, tx, msg); err != nil {
			return err
		}
		if msg.Body.OrderID == "3" {
			// A failed statement aborts the transaction: only the savepoint
			// can bring it back.
			_, err := tx.Exec(ctx, `SELECT 1/0`)
			return err
		}
		return nil
	}, fullBatch(5))

	msgs := make([]*inboxtype.Message[order], 5)
	for i := range msgs {
		msgs[i] = newMsg(t, "payments", order{OrderID: strconv.Itoa(i + 1), Amount: i}, false)
	}
	errs := handleAll(t, h, msgs)
	for i, err := range errs {
		if i == 2 {
			require.ErrorContains(t, err, "division by zero")
			continue
		}
		require.NoError(t, err)
	}
	require.Equal(t, 4, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:3'`))
	require.Equal(t, 4, b.count(t, `SELECT count(*) FROM ledger`))
	r := b.get(t, "payments", "order:3")
	require.Equal(t, inbox.RecordFailed, r.Status)
	require.Equal(t, 1, r.Attempts)
	require.Contains(t, *r.LastError, "division by zero")
	require.Nil(t, r.CompletedAt)
	require.Equal(t, 4, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE status = 'completed'`))

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, txids, 5)
	for _, id := range txids {
		require.Equal(t, txids["order:1"], id, "one transaction for the whole batch")
	}
}

func TestGroupCommit_DuplicatesInsideOneBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var calls atomic.Int64
	h := inbox.Handler(b.store, effectHandler(&calls), fullBatch(6))
	var msgs []*inboxtype.Message[order]
	for _, id := range []string{"a", "b", "a", "c", "b", "a"} {
		msgs = append(msgs, newMsg(t, "payments", order{OrderID: id}, false))
	}
	errs := handleAll(t, h, msgs)
	var ok, dup int
	for _, err := range errs {
		if err == nil {
			ok++
			continue
		}
		require.ErrorIs(t, err, retry.ErrDuplicate)
		dup++
	}
	require.Equal(t, 3, ok)
	require.Equal(t, 3, dup)
	require.Equal(t, int64(3), calls.Load())
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM effects`))
}

func TestGroupCommit_DuplicateOfAFailedDeliveryInTheSameBatchProceeds(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var calls atomic.Int64
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if calls.Add(1) == 1 {
			return errors.New("first copy fails")
		}
		return effectHandler(nil)(ctx, tx, msg)
	}, fullBatch(2))
	errs := handleAll(t, h, []*inboxtype.Message[order]{
		newMsg(t, "payments", order{OrderID: "x"}, false),
		newMsg(t, "payments", order{OrderID: "x"}, false),
	})
	require.ElementsMatch(t, []bool{true, false}, []bool{errs[0] == nil, errs[1] == nil})
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
	r := b.get(t, "payments", "order:x")
	require.Equal(t, inbox.RecordCompleted, r.Status)
	require.Equal(t, 1, r.Attempts, "both copies are broker attempt 1")
}

func TestGroupCommit_OverlappingBatchesInOppositeOrderDoNotDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	const n = 24
	var calls atomic.Int64
	opts := &inbox.GroupCommit{MaxBatch: n, MaxWait: 20 * time.Millisecond, MaxInFlight: 2}
	h1 := inbox.Handler(b.store, effectHandler(&calls), opts)
	h2 := inbox.Handler(b.store, effectHandler(&calls), opts)

	errs := make([]error, 2*n)
	var wg sync.WaitGroup
	for round := range 3 {
		for i := range n {
			asc := newMsg(t, "payments", order{OrderID: strconv.Itoa(round*n + i)}, false)
			desc := newMsg(t, "payments", order{OrderID: strconv.Itoa(round*n + n - 1 - i)}, false)
			wg.Go(func() { errs[i] = h1.Handle(t.Context(), asc) })
			wg.Go(func() { errs[n+i] = h2.Handle(t.Context(), desc) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				require.ErrorIs(t, err, retry.ErrDuplicate)
			}
		}
	}
	require.Equal(t, int64(3*n), calls.Load())
	require.Equal(t, 3*n, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, 3*n, b.count(t, `SELECT count(DISTINCT key) FROM effects`))
}

// A delivery whose writes fail only at COMMIT (a deferred constraint)
// fails the batch's commit; the batch's deliveries then run again one by
// one, so only that delivery fails and the others commit once.
func TestGroupCommit_CommitFailureFailsOnlyItsDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var calls atomic.Int64
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if err := effectHandler(&calls)(ctx, tx, msg); err != nil {
			return err
		}
		if msg.Body.OrderID == "2" {
			// A deferred foreign key: the statement succeeds, COMMIT fails.
			_, err := tx.Exec(ctx, `INSERT INTO child (id) VALUES (42)`)
			return err
		}
		return nil
	}, fullBatch(4))
	requireOnlyPermanent(t, handleAll(t, h, orders(t, 4)), 1, inbox.ReasonDBIntegrityViolation)
	require.Equal(t, int64(8), calls.Load(), "each handler ran in the batch and once more alone")
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:2'`))
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE status = 'completed'`))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE key = 'order:2' AND status = 'completed'`))
}

func TestGroupCommit_LoneDeliveryIsNotHeldBeyondMaxWait(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := inbox.Handler(b.store, effectHandler(nil), &inbox.GroupCommit{})
	require.NoError(t, h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "lone"}, false)))
	require.ErrorIs(t, h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "lone"}, false)), retry.ErrDuplicate)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
}

func TestGroupCommit_HandlerShapesInsideSavepoints(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		switch msg.Body.OrderID {
		case "a": // fails before any statement: its savepoint was never sent
			return errors.New("a: rejected up front")
		case "b": // a nested transaction whose failure it handles itself
			_ = pgx.BeginFunc(ctx, tx, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `SELECT 1/0`)
				return err
			})
			return effectHandler(nil)(ctx, tx, msg)
		case "c": // writes, then fails
			if err := effectHandler(nil)(ctx, tx, msg); err != nil {
				return err
			}
			return errors.New("c: failed after writing")
		default: // reads first, then writes
			var n int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&n); err != nil {
				return err
			}
			return effectHandler(nil)(ctx, tx, msg)
		}
	}, fullBatch(4))
	var msgs []*inboxtype.Message[order]
	for _, id := range []string{"a", "b", "c", "d"} {
		msgs = append(msgs, newMsg(t, "payments", order{OrderID: id}, false))
	}
	errs := handleAll(t, h, msgs)
	require.ErrorContains(t, errs[0], "rejected up front")
	require.NoError(t, errs[1])
	require.ErrorContains(t, errs[2], "failed after writing")
	require.NoError(t, errs[3])
	rows, err := b.pool.Query(t.Context(), `SELECT key FROM effects ORDER BY key`)
	require.NoError(t, err)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"order:b", "order:d"}, keys)
	require.Equal(t, inbox.RecordFailed, b.get(t, "payments", "order:a").Status)
	require.Equal(t, inbox.RecordFailed, b.get(t, "payments", "order:c").Status)
	require.Equal(t, inbox.RecordCompleted, b.get(t, "payments", "order:d").Status)
}

// A handler whose context ends in the middle of a statement on the
// batch's connection fails alone, whether the statement is cancelled or the
// connection closed: the rest of the batch commits.
func TestGroupCommit_HandlerContextEndingMidStatementFailsOnlyItsDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if err := effectHandler(nil)(ctx, tx, msg); err != nil {
			return err
		}
		if msg.Body.OrderID == "2" {
			sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			_, err := tx.Exec(sctx, `SELECT pg_sleep(30)`)
			return err
		}
		return nil
	}, fullBatch(4))
	requireOnlyRetry(t, handleAll(t, h, orders(t, 4)), 1, "")
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:2'`))
	require.Equal(t, inbox.RecordFailed, b.get(t, "payments", "order:2").Status)
}

// A handler that sends its writes as one batch gets its savepoint in that
// batch: a batch whose statement fails rolls back only its delivery, and
// the others' batched writes commit.
func TestGroupCommit_BatchHandlerInsideSavepoints(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		batch := &pgx.Batch{}
		batch.Queue(`INSERT INTO effects (key, amount) VALUES ($1, 0)`, msg.Key)
		if msg.Body.OrderID == "2" {
			batch.Queue(`SELECT 1/0`)
		}
		batch.Queue(`SELECT $1::text`, msg.Key)
		br := tx.SendBatch(ctx, batch)
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return err
		}
		if msg.Body.OrderID == "2" {
			if _, err := br.Exec(); err != nil {
				_ = br.Close()
				return err
			}
		}
		var echoed string
		if err := br.QueryRow().Scan(&echoed); err != nil {
			_ = br.Close()
			return err
		}
		if echoed != msg.Key {
			return errors.New("batch results out of order: " + echoed)
		}
		return br.Close()
	}, fullBatch(3))
	msgs := make([]*inboxtype.Message[order], 3)
	for i := range msgs {
		msgs[i] = newMsg(t, "payments", order{OrderID: strconv.Itoa(i + 1)}, false)
	}
	errs := handleAll(t, h, msgs)
	require.NoError(t, errs[0])
	require.ErrorContains(t, errs[1], "division by zero")
	require.NoError(t, errs[2])
	rows, err := b.pool.Query(t.Context(), `SELECT key FROM effects ORDER BY key`)
	require.NoError(t, err)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"order:1", "order:3"}, keys)
	require.Equal(t, inbox.RecordFailed, b.get(t, "payments", "order:2").Status)
	require.Equal(t, inbox.RecordCompleted, b.get(t, "payments", "order:3").Status)
}

// A batch larger than PostgreSQL's cache of a transaction's subtransactions
// (64 per backend) commits in transactions of at most 64 savepoints, so
// that no snapshot on the server has to look its subtransactions up in
// pg_subtrans; every delivery still commits once. In both modes that take
// a savepoint per delivery.
func TestGroupCommit_LargeBatchKeepsAtMost64SavepointsPerTransaction(t *testing.T) {
	t.Parallel()
	const n = 150
	for _, mode := range []string{"transactional", "claim"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			var mu sync.Mutex
			perTx := map[int64]int{}
			write := func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
				if err := effectHandler(nil)(ctx, tx, msg); err != nil {
					return err
				}
				var txid int64
				if err := tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&txid); err != nil {
					return err
				}
				mu.Lock()
				perTx[txid]++
				mu.Unlock()
				return nil
			}
			h := inbox.Handler(b.store, write, fullBatch(n))
			if mode == "claim" {
				h = inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
					return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error { return write(ctx, tx, msg) })
				}, fullBatch(n), nil)
			}
			for i, err := range handleAll(t, h, orders(t, n)) {
				require.NoError(t, err, "delivery %d", i)
			}
			require.Equal(t, n, b.count(t, `SELECT count(*) FROM effects`))
			require.Equal(t, n, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE status = 'completed'`))
			total := 0
			for txid, savepoints := range perTx {
				require.LessOrEqual(t, savepoints, 64, "savepoints in transaction %d", txid)
				total += savepoints
			}
			require.Equal(t, n, total, "each handler ran once")
			require.Len(t, perTx, 3, "150 deliveries in transactions of at most 64")
		})
	}
}
