package inbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// requirePermanent asserts that err dead-letters at once with reason.
func requirePermanent(t *testing.T, err error, reason string) {
	t.Helper()
	d := retry.Classify(err)
	require.Equal(t, retry.KindPermanent, d.Kind, "%v", err)
	require.Equal(t, reason, d.Reason, "%v", err)
}

// requireOnlyPermanent asserts that errs[bad] fails permanently with
// reason and that every other delivery succeeded.
func requireOnlyPermanent(t *testing.T, errs []error, bad int, reason string) {
	t.Helper()
	for i, err := range errs {
		if i != bad {
			require.NoError(t, err, "delivery %d", i)
			continue
		}
		requirePermanent(t, err, reason)
	}
}

// A business write that PostgreSQL refuses for its data (class 22) or its
// integrity (class 23 other than unique) can never succeed: the delivery
// fails permanently with a reason naming the class, not as a database
// outage, and nothing of it is committed.
func TestHandler_DataAndIntegrityErrorsArePermanent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, sql, reason string
		args              []any
		atCommit          bool // a failed COMMIT records no failure on the row
	}{
		{"NUL in a text column (22021)", `INSERT INTO ledger (key) VALUES ($1)`, inbox.ReasonDBDataException, []any{"a\x00b"}, false},
		{"invalid text representation (22P02)", `INSERT INTO effects (key, amount) VALUES ('k', $1::text::int)`, inbox.ReasonDBDataException, []any{"x"}, false},
		{"not null (23502)", `INSERT INTO ledger (key) VALUES (NULL)`, inbox.ReasonDBIntegrityViolation, nil, false},
		{"check (23514)", `INSERT INTO checked (n) VALUES (-1)`, inbox.ReasonDBIntegrityViolation, nil, false},
		{"deferred foreign key, at COMMIT (23503)", `INSERT INTO child (id) VALUES (42)`, inbox.ReasonDBIntegrityViolation, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			_, err := b.pool.Exec(t.Context(), `CREATE TABLE checked (n int CHECK (n > 0))`)
			require.NoError(t, err)
			h := inbox.Handler(b.store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
				if err := effectHandler(nil)(ctx, tx, msg); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, tc.sql, tc.args...)
				return err
			}, nil)
			requirePermanent(t, h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "d"}, false)), tc.reason)
			require.Zero(t, b.count(t, `SELECT count(*) FROM effects`))
			if !tc.atCommit {
				require.Equal(t, inbox.RecordFailed, b.get(t, "payments", "order:d").Status)
			}
		})
	}
}

// A key PostgreSQL cannot store (a NUL byte) fails the inbox's own claim
// statement: that is the message's fault, not the database's, so it is
// permanent (db_data_exception), in every mode. In a batch it fails alone:
// the deliveries claimed with it commit.
func TestHandler_UnstorableKeyIsPermanentAndFailsAlone(t *testing.T) {
	t.Parallel()
	claimMode := func(s *inbox.Store, group bool) inboxtype.Handler[order] {
		var gc *inbox.GroupCommit
		if group {
			gc = &inbox.GroupCommit{}
		}
		return inbox.ClaimHandler(s, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
			return c.Complete(ctx, completeWithEffect(msg))
		}, gc, nil)
	}
	for _, tc := range []struct {
		name string
		h    func(s *inbox.Store) inboxtype.Handler[order]
		n    int // deliveries handled together, the first with the bad key
	}{
		{"per message", func(s *inbox.Store) inboxtype.Handler[order] { return inbox.Handler(s, effectHandler(nil), nil) }, 1},
		{"group commit", func(s *inbox.Store) inboxtype.Handler[order] {
			return inbox.Handler(s, effectHandler(nil), fullBatch(4))
		}, 4},
		{"claim", func(s *inbox.Store) inboxtype.Handler[order] { return claimMode(s, false) }, 1},
		{"claims of concurrent deliveries", func(s *inbox.Store) inboxtype.Handler[order] { return claimMode(s, true) }, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			msgs := orders(t, tc.n)
			msgs[0] = newMsg(t, "payments", order{OrderID: "bad\x00key", Amount: 1}, false)
			errs := handleAll(t, tc.h(b.store), msgs)
			requirePermanent(t, errs[0], inbox.ReasonDBDataException)
			for i := 1; i < tc.n; i++ {
				require.NoError(t, errs[i], "delivery %d", i)
			}
			require.Equal(t, tc.n-1, b.count(t, `SELECT count(*) FROM effects`))
			require.Equal(t, tc.n-1, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE status = 'completed'`))
		})
	}
}
