package inbox_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/migrations"
	"github.com/inboxmq/inboxmq/retry"
)

// oddResult is a result in no normal form: keys out of order, two spaces.
// Any re-encoding (json.Marshal's compaction, jsonb's normal form) changes
// its bytes.
const oddResult = `{"b":1,  "a":[2,1]}`

// resultPaths are the inbox's handlers, each storing oddResult, on every
// path that writes a result: transactional (alone, in a group commit),
// BatchHandler (alone, in a group commit), claim mode (the bare
// completion, a completion with writes, a group of completions).
func resultPaths(b *testBundle) []resultPath {
	set := func(msg *inboxtype.Message[order]) error { return msg.SetResult(json.RawMessage(oddResult)) }
	tx := func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if err := set(msg); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (key, amount) VALUES ($1, $2)`, msg.Key, msg.Body.Amount)
		return err
	}
	batch := func(_ context.Context, wb *pgx.Batch, msg *inboxtype.Message[order]) error {
		wb.Queue(`INSERT INTO effects (key, amount) VALUES ($1, $2)`, msg.Key, msg.Body.Amount)
		return set(msg)
	}
	bare := func(_ context.Context, _ *inbox.Claim, msg *inboxtype.Message[order]) error { return set(msg) }
	withWrites := func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		if err := set(msg); err != nil {
			return err
		}
		return c.Complete(ctx, completeWithEffect(msg))
	}
	group := &inbox.GroupCommit{MaxBatch: 1}
	return []resultPath{
		{"tx", 1, inbox.Handler(b.store, tx, nil)},
		{"tx_group", 1, inbox.Handler(b.store, tx, group)},
		{"batch", 1, inbox.BatchHandler(b.store, batch, nil)},
		{"batch_group", 1, inbox.BatchHandler(b.store, batch, group)},
		{"claim_bare", 0, inbox.ClaimHandler(b.store, bare, nil, nil)},
		{"claim_writes", 1, inbox.ClaimHandler(b.store, withWrites, nil, nil)},
		{"claim_group_bare", 0, inbox.ClaimHandler(b.store, bare, group, nil)},
		{"claim_group_writes", 1, inbox.ClaimHandler(b.store, withWrites, group, nil)},
	}
}

// resultPath is a handler storing oddResult and the effect rows it writes.
type resultPath struct {
	name    string
	effects int
	h       inboxtype.Handler[order]
}

// The result is stored as the handler gave it: the delivery that did the
// work, the row and every duplicate hold the same bytes, on every path.
func TestResult_StoredBytesAreTheHandlers(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, p := range resultPaths(b) {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			name, h := p.name, p.h
			o := order{OrderID: name, Amount: 1}
			first := newMsg(t, name, o, false)
			require.NoError(t, h.Handle(t.Context(), first))
			require.Equal(t, oddResult, string(first.Result()), "the first delivery keeps the handler's bytes")

			var column string
			require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT result::text FROM inboxmq_inbox WHERE consumer = $1 AND key = $2`,
				name, o.IdempotencyKey()).Scan(&column))
			require.Equal(t, oddResult, column, "the row holds the handler's bytes")
			require.Equal(t, oddResult, string(b.get(t, name, o.IdempotencyKey()).Result), "Store.Get returns them")

			dup := newMsg(t, name, o, false)
			require.ErrorIs(t, h.Handle(t.Context(), dup), retry.ErrDuplicate)
			require.Equal(t, oddResult, string(dup.Result()), "a duplicate gets the same bytes")
			require.Equal(t, p.effects, b.count(t, `SELECT count(*) FROM effects WHERE key = $1`, o.IdempotencyKey()), "the effect, once")
		})
	}
}

// In a group commit every delivery's result is written by one statement
// (and, with BatchHandler, by the group's one claim): each keeps its
// handler's bytes, and so do the duplicates, which meet in a group too.
func TestResult_GroupStoresEachDeliverysBytes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	results := []string{oddResult, `[ "x" , {"z":null,"y":true} ]`}
	set := func(msg *inboxtype.Message[order]) error {
		return msg.SetResult(json.RawMessage(results[msg.Body.Amount]))
	}
	tx := func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if _, err := tx.Exec(ctx, `INSERT INTO effects (key, amount) VALUES ($1, $2)`, msg.Key, msg.Body.Amount); err != nil {
			return err
		}
		return set(msg)
	}
	batch := func(_ context.Context, wb *pgx.Batch, msg *inboxtype.Message[order]) error {
		wb.Queue(`INSERT INTO effects (key, amount) VALUES ($1, $2)`, msg.Key, msg.Body.Amount)
		return set(msg)
	}
	pair := &inbox.GroupCommit{MaxBatch: 2, MaxWait: time.Minute, MaxInFlight: 1}
	for _, p := range []resultPath{
		{name: "tx_group", h: inbox.Handler(b.store, tx, pair)},
		{name: "batch_group", h: inbox.BatchHandler(b.store, batch, pair)},
	} {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			msgs := func() []*inboxtype.Message[order] {
				return []*inboxtype.Message[order]{
					newMsg(t, p.name, order{OrderID: p.name + "-0", Amount: 0}, false),
					newMsg(t, p.name, order{OrderID: p.name + "-1", Amount: 1}, false),
				}
			}
			firsts := msgs()
			for i, err := range handleAll(t, p.h, firsts) {
				require.NoError(t, err)
				require.Equal(t, results[i], string(firsts[i].Result()))
				require.Equal(t, results[i], string(b.get(t, p.name, firsts[i].Key).Result), "the row holds delivery %d's bytes", i)
			}
			dups := msgs()
			for i, err := range handleAll(t, p.h, dups) {
				require.ErrorIs(t, err, retry.ErrDuplicate)
				require.Equal(t, results[i], string(dups[i].Result()), "duplicate %d gets its first delivery's bytes", i)
			}
		})
	}
}

// A result set after the commit is not stored (claim mode stores the one
// set before Claim.Complete), so it is not what the delivery holds either:
// the delivery that did the work, and its reply, carry the stored bytes,
// as its duplicates do.
func TestResult_SetAfterCompleteLeavesTheStoredBytes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, group := range []bool{false, true} {
		t.Run("group_commit="+strconv.FormatBool(group), func(t *testing.T) {
			t.Parallel()
			var gc *inbox.GroupCommit
			if group {
				gc = &inbox.GroupCommit{MaxBatch: 1}
			}
			h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
				if err := msg.SetResult(json.RawMessage(oddResult)); err != nil {
					return err
				}
				if err := c.Complete(ctx, completeWithEffect(msg)); err != nil {
					return err
				}
				return msg.SetResult("set after the commit")
			}, gc, nil)
			o := order{OrderID: "late-" + strconv.FormatBool(group), Amount: 1}
			first := newMsg(t, "c", o, false)
			require.NoError(t, h.Handle(t.Context(), first))
			require.Equal(t, oddResult, string(b.get(t, "c", o.IdempotencyKey()).Result))
			require.Equal(t, oddResult, string(first.Result()), "the delivery holds the stored bytes")
			dup := newMsg(t, "c", o, false)
			require.ErrorIs(t, h.Handle(t.Context(), dup), retry.ErrDuplicate)
			require.Equal(t, oddResult, string(dup.Result()))
		})
	}
}

// This version runs on an inbox not yet migrated to 00005 (its result
// column still jsonb), so workers can be upgraded before the migration:
// every path completes, and duplicates get the row's bytes — there,
// jsonb's normal form, as before.
func TestResult_EveryPathRunsBeforeMigration00005(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Schema(t)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS, goose.WithTableName(migrations.VersionTable))
	require.NoError(t, err)
	_, err = p.DownTo(t.Context(), 4)
	require.NoError(t, err)
	b := setupOn(t, pool, nil)
	for _, rp := range resultPaths(b) {
		t.Run(rp.name, func(t *testing.T) {
			t.Parallel()
			o := order{OrderID: rp.name, Amount: 1}
			require.NoError(t, rp.h.Handle(t.Context(), newMsg(t, rp.name, o, false)))
			stored := b.get(t, rp.name, o.IdempotencyKey()).Result
			require.JSONEq(t, oddResult, string(stored))
			dup := newMsg(t, rp.name, o, false)
			require.ErrorIs(t, rp.h.Handle(t.Context(), dup), retry.ErrDuplicate)
			require.Equal(t, string(stored), string(dup.Result()), "a duplicate gets the row's bytes")
			require.Equal(t, rp.effects, b.count(t, `SELECT count(*) FROM effects WHERE key = $1`, o.IdempotencyKey()))
		})
	}
}
