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
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// The transaction a handler gets is the inbox's, in every mode: the
// handler cannot end it, and it ends with the delivery.

// A handler's Rollback and Commit end nothing: they fail, and the inbox
// commits the handler's writes with the key, once — per message as in a
// batch, and in claim mode's completion.
func TestTx_HandlerCannotEndTheTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var mu sync.Mutex
	told := map[string][]error{}
	endTx := func(ctx context.Context, tx pgx.Tx, key string) {
		rerr := tx.Rollback(ctx)
		cerr := tx.Commit(ctx)
		mu.Lock()
		told[key] = []error{rerr, cerr}
		mu.Unlock()
	}
	txHandler := func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if err := effectHandler(nil)(ctx, tx, msg); err != nil {
			return err
		}
		endTx(ctx, tx, msg.Namespace+"/"+msg.Key)
		return nil
	}
	for name, h := range map[string]inboxtype.Handler[order]{
		"per-message":  inbox.Handler(b.store, txHandler, nil),
		"group commit": inbox.Handler(b.store, txHandler, fullBatch(2)),
		"claim": inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
			return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error {
				if err := completeWithEffect(msg)(ctx, tx); err != nil {
					return err
				}
				endTx(ctx, tx, msg.Namespace+"/"+msg.Key)
				return nil
			})
		}, nil, nil),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			msgs := []*inboxtype.Message[order]{newMsg(t, name, order{OrderID: name + "-1", Amount: 1}, false)}
			if name == "group commit" {
				msgs = append(msgs, newMsg(t, name, order{OrderID: name + "-2", Amount: 2}, false))
			}
			for _, err := range handleAll(t, h, msgs) {
				require.NoError(t, err)
			}
			for _, m := range msgs {
				mu.Lock()
				errs := told[name+"/"+m.Key]
				mu.Unlock()
				require.Len(t, errs, 2)
				require.Error(t, errs[0], "Rollback")
				require.Error(t, errs[1], "Commit")
				require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = $1`, m.Key), "one effect")
				require.Equal(t, inbox.RecordCompleted, b.get(t, name, m.Key).Status)
			}
		})
	}
}

// A handler's transaction ends with its delivery: a statement sent on it
// afterwards (from a goroutine the handler left behind) fails with
// pgx.ErrTxClosed and writes nothing, in every mode — also when the
// delivery's result was written in the COMMIT's round trip.
func TestTx_EndsWithItsDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	kept := map[string]chan pgx.Tx{}
	keep := func(name string, tx pgx.Tx) {
		select {
		case kept[name] <- tx:
		default: // one is enough
		}
	}
	txHandler := func(name string) inbox.TxHandlerFunc[order] {
		return func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
			if err := resultHandler()(ctx, tx, msg); err != nil {
				return err
			}
			keep(name, tx)
			return nil
		}
	}
	modes := map[string]struct {
		h inboxtype.Handler[order]
		n int
	}{
		"per-message":  {inbox.Handler(b.store, txHandler("per-message"), nil), 1},
		"group commit": {inbox.Handler(b.store, txHandler("group commit"), fullBatch(2)), 2},
		"claim": {inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
			return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error {
				keep("claim", tx)
				return resultHandler()(ctx, tx, msg)
			})
		}, nil, nil), 1},
	}
	for name := range modes {
		kept[name] = make(chan pgx.Tx, 1)
	}
	for name, m := range modes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			msgs := make([]*inboxtype.Message[order], m.n)
			for i := range msgs {
				msgs[i] = newMsg(t, name, order{OrderID: name + "-" + strconv.Itoa(i), Amount: 1}, false)
			}
			for _, err := range handleAll(t, m.h, msgs) {
				require.NoError(t, err)
			}
			tx := testenv.WaitChan(t, kept[name], "the handler's transaction")
			late := make(chan error, 1)
			go func() {
				_, err := tx.Exec(context.Background(), `INSERT INTO effects (key, amount) VALUES ($1, 0)`, "late@"+name)
				late <- err
			}()
			require.ErrorIs(t, testenv.WaitChan(t, late, "the late statement"), pgx.ErrTxClosed)
			require.Equal(t, 0, b.count(t, `SELECT count(*) FROM effects WHERE key = $1`, "late@"+name), "nothing written")
			require.Equal(t, m.n, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE consumer = $1 AND status = 'completed' AND result IS NOT NULL`, name))
		})
	}
}
