package inbox_test

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
)

// A handler that writes in one round trip and leaves a result costs three
// round trips in all: BEGIN + claim, its own statement, and the result
// written with the COMMIT — not a fourth for the result.
func TestResult_WrittenInTheCommitsRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tr := &countingTracer{}
	b := setupOn(t, tracedPool(t, tr), nil)
	h := inbox.Handler(b.store, resultHandler(), nil)

	o := order{OrderID: "rt", Amount: 7}
	before := tr.n.Load()
	require.NoError(t, h.Handle(ctx, newMsg(t, "c", o, false)))
	require.Equal(t, int64(3), tr.n.Load()-before, "round trips of one delivery")

	stored := decodeResult(t, b.get(t, "c", o.IdempotencyKey()).Result)
	require.Equal(t, "rt", stored.Order)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE id = $1`, stored.PaymentID))
}

// In a group commit each delivery's result lands on its own row, written
// in one statement with the COMMIT; a delivery whose handler failed in the
// batch stores none, and its effect rolled back to its savepoint.
func TestResult_GroupCommitStoresEachDeliverysOwn(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, nil)
	h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if err := resultHandler()(ctx, tx, msg); err != nil {
			return err
		}
		if msg.Body.OrderID == "3" {
			_, err := tx.Exec(ctx, `SELECT 1/0`) // fails after its result was set
			return err
		}
		return nil
	}, fullBatch(8))

	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = h.Handle(ctx, newMsg(t, "g", order{OrderID: strconv.Itoa(i), Amount: i + 1}, false))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		key := order{OrderID: strconv.Itoa(i)}.IdempotencyKey()
		rec := b.get(t, "g", key)
		if i == 3 {
			require.Error(t, err)
			require.Nil(t, rec.Result, "a failed delivery stores no result")
			continue
		}
		require.NoError(t, err, "delivery %d", i)
		stored := decodeResult(t, rec.Result)
		require.Equal(t, strconv.Itoa(i), stored.Order)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE id = $1 AND amount = $2`, stored.PaymentID, i+1))
	}
	require.Equal(t, 7, b.count(t, `SELECT count(*) FROM effects`))
}
