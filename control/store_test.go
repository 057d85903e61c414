package control_test

import (
	"context"
	"crypto/rand"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

func TestStore_ControlsRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := pgtest.Schema(t)
	s := control.NewStore(pool)

	require.NoError(t, s.Pause(ctx, "payments", &control.ChangeOpts{By: "alice", Reason: "incident 42"}))
	require.NoError(t, s.SetConcurrency(ctx, "payments", 2, nil))
	require.NoError(t, s.SetConcurrency(ctx, "emails", 1, nil))

	snap, err := s.List(ctx)
	require.NoError(t, err)
	require.Len(t, snap.Controls, 2)
	require.Equal(t, "emails", snap.Controls[0].Namespace)
	require.False(t, snap.Controls[0].Paused)
	p := snap.Controls[1]
	require.Equal(t, "payments", p.Namespace)
	require.True(t, p.Paused, "SetConcurrency keeps the pause")
	require.Equal(t, 2, p.Concurrency)
	require.Equal(t, "postgres", p.UpdatedBy, "nil opts: the database user")
	require.Empty(t, p.Reason)

	require.NoError(t, s.Resume(ctx, "payments", &control.ChangeOpts{By: "bob"}))
	require.NoError(t, s.SetConcurrency(ctx, "payments", 0, nil))
	snap, err = s.List(ctx)
	require.NoError(t, err)
	require.False(t, snap.Controls[1].Paused)
	require.Zero(t, snap.Controls[1].Concurrency)
}

func TestStore_InvalidArguments(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := pgtest.Schema(t)
	s := control.NewStore(pool)

	require.ErrorIs(t, s.Pause(ctx, "bad name; drop", nil), control.ErrInvalid)
	require.ErrorIs(t, s.SetConcurrency(ctx, "payments", -1, nil), control.ErrInvalid)
	require.ErrorIs(t, s.Block(ctx, control.Block{Namespace: "payments"}), control.ErrInvalid)
	snap, err := s.List(ctx)
	require.NoError(t, err)
	require.Empty(t, snap.Controls)
	require.Empty(t, snap.Blocks)
}

func TestStore_Blocks(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := pgtest.Schema(t)
	s := control.NewStore(pool)

	require.NoError(t, s.Block(ctx, control.Block{Namespace: "payments", Pattern: "order:7", Reason: "fraud"}))
	require.NoError(t, s.Block(ctx, control.Block{Namespace: "payments", Pattern: "tenant:9:", Prefix: true}))

	for _, tc := range []struct {
		key     string
		blocked bool
	}{
		{"order:7", true},
		{"order:70", false},
		{"tenant:9:order:1", true},
		{"tenant:90", false},
	} {
		b, ok, err := s.Blocked(ctx, "payments", tc.key)
		require.NoError(t, err)
		require.Equal(t, tc.blocked, ok, tc.key)
		if ok {
			require.True(t, b.Matches(tc.key))
		}
		_, ok, err = s.Blocked(ctx, "emails", tc.key)
		require.NoError(t, err)
		require.False(t, ok, "blocks are per namespace")
	}

	removed, err := s.Unblock(ctx, "payments", "order:7", false)
	require.NoError(t, err)
	require.True(t, removed)
	removed, err = s.Unblock(ctx, "payments", "order:7", false)
	require.NoError(t, err)
	require.False(t, removed)

	snap, err := s.List(ctx)
	require.NoError(t, err)
	require.Len(t, snap.Blocks, 1)
	require.True(t, snap.Blocks[0].Prefix)
}

// Every write notifies on control.Channel when it commits, with the
// namespace as payload.
func TestStore_NotifiesOnCommit(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, schema := pgtest.Schema(t)
	listener, err := pgx.Connect(ctx, pgtest.URL(schema))
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", err)
	}
	t.Cleanup(func() { _ = listener.Close(context.Background()) })
	_, err = listener.Exec(ctx, "LISTEN "+control.Channel)
	require.NoError(t, err)

	// The namespace is unique to this test: other tests notify on the
	// same database-wide channel.
	name := "c." + rand.Text()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, control.NewStore(tx).Pause(ctx, name, nil))
	require.NoError(t, tx.Commit(ctx))

	wctx, cancel := context.WithTimeout(ctx, testenv.Timeout())
	defer cancel()
	for {
		n, err := listener.WaitForNotification(wctx)
		require.NoError(t, err)
		if n.Payload == name {
			require.Equal(t, control.Channel, n.Channel)
			return
		}
	}
}
