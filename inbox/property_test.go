package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// What a delivery's handler does, chosen by the generator.
type behaviour int

const (
	behaveOK              behaviour = iota
	behaveFailBeforeWrite           // an error before any statement
	behaveFailAfterWrite            // the business writes, then an error
	behaveSQLError                  // the business writes, then a failing statement
	behaveCommitError               // the business writes and one that fails only at COMMIT (a deferred constraint)
)

var propSeq atomic.Int64

// TestProperty_AtMostOneEffectPerKey drives random groups of concurrent
// deliveries — duplicates of a few keys, each failing in a random way or
// succeeding — through the commit modes (per message, group commit,
// BatchHandler's one round trip alone and group-committed, and the first
// two for claim mode's completions), and checks after every group that no
// key has more than one effect, that a key some delivery completed has
// exactly one, and that every key ends with exactly one effect once it is
// delivered successfully.
func TestProperty_AtMostOneEffectPerKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	rapid.Check(t, func(rt *rapid.T) {
		ctx := context.Background()
		run := propSeq.Add(1)
		mode := rapid.SampledFrom([]string{"per-message", "group", "batch", "batch-group", "claim", "claim-group"}).Draw(rt, "mode")
		var group *inbox.GroupCommit
		switch mode {
		case "group", "batch-group", "claim-group":
			group = &inbox.GroupCommit{MaxBatch: 8, MaxWait: time.Millisecond, MaxInFlight: 2}
		}
		var behaviours sync.Map // message id -> behaviour
		behaviourOf := func(msg *inboxtype.Message[order]) behaviour {
			v, _ := behaviours.Load(msg.ID)
			be, _ := v.(behaviour)
			return be
		}
		// write is the business writes, failing after them as told.
		write := func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
			if err := effectHandler(nil)(ctx, tx, msg); err != nil {
				return err
			}
			switch behaviourOf(msg) {
			case behaveFailAfterWrite:
				return retry.Permanent(errors.New("fails after writing"))
			case behaveSQLError:
				_, err := tx.Exec(ctx, `SELECT 1/0`)
				return err
			case behaveCommitError:
				_, err := tx.Exec(ctx, `INSERT INTO child (id) VALUES (42)`)
				return err
			}
			return nil
		}
		var h inboxtype.Handler[order]
		switch {
		case strings.HasPrefix(mode, "batch"):
			// The same writes and failures, queued: they fail in the
			// batch's round trip, and again on the per-message path.
			h = inbox.BatchHandler(b.store, func(_ context.Context, bt *pgx.Batch, msg *inboxtype.Message[order]) error {
				be := behaviourOf(msg)
				if be == behaveFailBeforeWrite {
					return errors.New("fails before writing")
				}
				bt.Queue(`INSERT INTO effects (key, amount) VALUES ($1, $2)`, msg.Key, msg.Body.Amount)
				bt.Queue(`INSERT INTO ledger (key) VALUES ($1)`, msg.Key)
				switch be {
				case behaveFailAfterWrite:
					return retry.Permanent(errors.New("fails after writing"))
				case behaveSQLError:
					bt.Queue(`SELECT 1/0`)
				case behaveCommitError:
					bt.Queue(`INSERT INTO child (id) VALUES (42)`)
				}
				return nil
			}, group)
		case strings.HasPrefix(mode, "claim"):
			h = inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
				if behaviourOf(msg) == behaveFailBeforeWrite {
					return errors.New("fails before completing")
				}
				return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error { return write(ctx, tx, msg) })
			}, group, nil)
		default:
			h = inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
				if behaviourOf(msg) == behaveFailBeforeWrite {
					return errors.New("fails before writing")
				}
				return write(ctx, tx, msg)
			}, group)
		}

		nKeys := rapid.IntRange(1, 4).Draw(rt, "keys")
		keyOf := func(i int) string { return fmt.Sprintf("p%d-%d", run, i) }
		effects := func(id string) int {
			var n int
			require.NoError(rt, b.pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE key = $1`, "order:"+id).Scan(&n))
			return n
		}
		deliver := func(ids []string, bes []behaviour) []error {
			errs := make([]error, len(ids))
			var wg sync.WaitGroup
			for i, id := range ids {
				m := newMsg(t, "prop", order{OrderID: id, Amount: 1}, false)
				behaviours.Store(m.ID, bes[i])
				wg.Go(func() { errs[i] = h.Handle(ctx, m) })
			}
			wg.Wait()
			return errs
		}

		steps := rapid.IntRange(1, 5).Draw(rt, "steps")
		for range steps {
			n := rapid.IntRange(1, 8).Draw(rt, "group")
			ids := make([]string, n)
			bes := make([]behaviour, n)
			for i := range n {
				ids[i] = keyOf(rapid.IntRange(0, nKeys-1).Draw(rt, "key"))
				bes[i] = behaviour(rapid.IntRange(0, int(behaveCommitError)).Draw(rt, "behaviour"))
			}
			errs := deliver(ids, bes)
			done := map[string]bool{}
			for i, err := range errs {
				switch {
				case err == nil:
					require.Equal(rt, behaveOK, bes[i], "only a succeeding handler reports success")
					done[ids[i]] = true
				case errors.Is(err, retry.ErrDuplicate):
					done[ids[i]] = true
				}
			}
			for k := range nKeys {
				id := keyOf(k)
				got := effects(id)
				require.LessOrEqual(rt, got, 1, "key %s has %d effects (mode %s)", id, got, mode)
				if done[id] {
					require.Equal(rt, 1, got, "key %s was reported done without its effect (mode %s)", id, mode)
				}
			}
		}
		// Every key, delivered once more successfully, ends with one effect.
		ids := make([]string, nKeys)
		bes := make([]behaviour, nKeys)
		for k := range nKeys {
			ids[k] = keyOf(k)
		}
		for i, err := range deliver(ids, bes) {
			if err != nil {
				require.ErrorIs(rt, err, retry.ErrDuplicate, "key %s", ids[i])
			}
		}
		for _, id := range ids {
			require.Equal(rt, 1, effects(id), "key %s (mode %s)", id, mode)
		}
	})
}
