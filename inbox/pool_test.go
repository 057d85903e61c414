package inbox_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/internal/logtest"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/retry"
)

// guardedPool is a pool of maxConns connections on schema built through
// inbox.ConfigurePool; edit, when not nil, changes the config first.
func guardedPool(t *testing.T, schema string, maxConns int32, edit func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(schema))
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	if edit != nil {
		edit(cfg)
	}
	require.NoError(t, inbox.ConfigurePool(cfg))
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// requireFreshConns acquires every connection of pool at once and
// requires that none is one of old (by backend PID).
func requireFreshConns(t *testing.T, pool *pgxpool.Pool, old map[uint32]bool) {
	t.Helper()
	var held []*pgxpool.Conn
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	for range pool.Config().MaxConns {
		c, err := pool.Acquire(t.Context())
		require.NoError(t, err)
		held = append(held, c)
		require.False(t, old[backendPID(t, c)], "a connection from before the fail-over signal was reused")
	}
}

func backendPID(t *testing.T, c *pgxpool.Conn) uint32 {
	t.Helper()
	return c.Conn().PgConn().PID()
}

// A connection opened after start-up on a node whose sessions are
// read-only (a standby, a fenced or demoted primary) is refused, and the
// refusal is a retryable db_read_only error, not a connection the store
// would write through.
func TestConfigurePool_RefusesReadOnlyNodeAfterStart(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.SchemaWith(t, 1)
	var readOnly atomic.Bool
	pool := guardedPool(t, schema, 2, func(cfg *pgxpool.Config) {
		cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
			if readOnly.Load() {
				// What a standby or a fenced primary answers.
				cc.RuntimeParams["default_transaction_read_only"] = "on"
			}
			return nil
		}
	})
	b := setupOn(t, pool, nil)

	readOnly.Store(true)
	pool.Reset() // the next acquire opens a connection

	_, err := pool.Exec(t.Context(), `INSERT INTO effects (key, amount) VALUES ('k', 1)`)
	require.ErrorIs(t, err, inbox.ErrReplica)
	d := retry.Classify(inbox.MapError(err))
	require.Equal(t, retry.KindRetry, d.Kind)
	require.Equal(t, inbox.ReasonDBReadOnly, d.Reason)

	// Through the inbox, the delivery is retried, nothing is written.
	err = inbox.Handler(b.store, effectHandler(nil), nil).Handle(t.Context(), newMsg(t, "payments", order{OrderID: "1", Amount: 1}, false))
	d = retry.Classify(err)
	require.Equal(t, retry.KindRetry, d.Kind, "%v", err)
	require.Equal(t, inbox.ReasonDBReadOnly, d.Reason)

	readOnly.Store(false)
	require.NoError(t, inbox.Handler(b.store, effectHandler(nil), nil).Handle(t.Context(), newMsg(t, "payments", order{OrderID: "1", Amount: 1}, false)))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
}

// A connection whose session turns read-only under it (the node was fenced
// or demoted while the pool held it) is closed on the first refused write
// (25006, retryable db_read_only), and every connection opened before that
// is retired: the next acquires dial again.
func TestConfigurePool_DropsConnectionsAfterReadOnlyRefusal(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.SchemaWith(t, 1)
	pool := guardedPool(t, schema, 2, nil)
	b := setupOn(t, pool, nil)
	ctx := t.Context()

	c1, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer c1.Release() // on failure; Release twice is a no-op
	c2, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer c2.Release()
	old := map[uint32]bool{backendPID(t, c1): true, backendPID(t, c2): true}

	_, err = c1.Exec(ctx, `SET default_transaction_read_only = on`)
	require.NoError(t, err)
	_, err = c1.Exec(ctx, `INSERT INTO effects (key, amount) VALUES ('k', 1)`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "25006", pgErr.Code)
	d := retry.Classify(inbox.MapError(err))
	require.Equal(t, retry.KindRetry, d.Kind)
	require.Equal(t, inbox.ReasonDBReadOnly, d.Reason)
	require.True(t, c1.Conn().IsClosed(), "the refused connection is closed")
	c1.Release()
	c2.Release()

	// Both connections are gone: the refused one, and the one opened before
	// the refusal (it would reach the same node).
	requireFreshConns(t, pool, old)
	require.NoError(t, inbox.Handler(b.store, effectHandler(nil), nil).Handle(ctx, newMsg(t, "payments", order{OrderID: "1", Amount: 1}, false)))
}

// A connection the server shuts down (57P01, as a restart or a demotion
// does) is dropped, the pool's older connections are retired, and the
// next transaction runs on a new connection.
func TestConfigurePool_AdminShutdownRetiresConnections(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.SchemaWith(t, 1)
	pool := guardedPool(t, schema, 2, nil)
	b := setupOn(t, pool, nil)
	ctx := t.Context()

	c1, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer c1.Release() // on failure; Release twice is a no-op
	c2, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer c2.Release()
	old := map[uint32]bool{backendPID(t, c1): true, backendPID(t, c2): true}

	_, err = c2.Exec(ctx, `SELECT pg_terminate_backend($1)`, backendPID(t, c1))
	require.NoError(t, err)
	_, err = c1.Exec(ctx, `SELECT 1`)
	require.Error(t, err)
	d := retry.Classify(inbox.MapError(err))
	require.Equal(t, retry.KindRetry, d.Kind, "%v", err)
	require.Equal(t, inbox.ReasonDBConnection, d.Reason)
	c1.Release()
	c2.Release()

	requireFreshConns(t, pool, old)
	require.NoError(t, inbox.Handler(b.store, effectHandler(nil), nil).Handle(ctx, newMsg(t, "payments", order{OrderID: "1", Amount: 1}, false)))
}

func TestConfigurePool_RefusesStandbySessionAttrs(t *testing.T) {
	t.Parallel()
	for _, tsa := range []string{"read-only", "standby", "prefer-standby"} {
		cfg, err := pgxpool.ParseConfig("postgres://u@127.0.0.1:1,127.0.0.1:2/db?target_session_attrs=" + tsa)
		require.NoError(t, err)
		err = inbox.ConfigurePool(cfg)
		require.ErrorContains(t, err, "target_session_attrs="+tsa, tsa)
	}
	for _, tsa := range []string{"read-write", "primary", "any"} {
		cfg, err := pgxpool.ParseConfig("postgres://u@127.0.0.1:1,127.0.0.1:2/db?target_session_attrs=" + tsa)
		require.NoError(t, err)
		require.NoError(t, inbox.ConfigurePool(cfg), tsa)
	}
	require.Error(t, inbox.ConfigurePool(nil))
}

// The hooks a config already has still run.
func TestConfigurePool_KeepsExistingHooks(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.SchemaWith(t, 1)
	var validated, connected, prepared atomic.Int64
	pool := guardedPool(t, schema, 1, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.ValidateConnect = func(context.Context, *pgconn.PgConn) error { validated.Add(1); return nil }
		cfg.AfterConnect = func(context.Context, *pgx.Conn) error { connected.Add(1); return nil }
		cfg.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) { prepared.Add(1); return true, nil }
	})
	require.NoError(t, pool.Ping(t.Context()))
	require.Equal(t, int64(1), validated.Load())
	require.Equal(t, int64(1), connected.Load())
	require.Equal(t, int64(1), prepared.Load())
}

// NewStore warns when its pool was not built through ConfigurePool, and
// not when it was; configuring a config twice is an error.
func TestConfigurePool_NewStoreWarnsWithoutIt(t *testing.T) {
	t.Parallel()
	plain, schema := pgtest.SchemaWith(t, 1)
	logger, rec := logtest.New(slog.LevelWarn)
	s, err := inbox.NewStore(plain, &inbox.StoreConfig{Logger: logger})
	require.NoError(t, err)
	require.NoError(t, s.Check(t.Context()))
	require.Len(t, rec.Containing("not built through inbox.ConfigurePool"), 1)

	guarded := guardedPool(t, schema, 1, nil)
	logger, rec = logtest.New(slog.LevelWarn)
	s, err = inbox.NewStore(guarded, &inbox.StoreConfig{Logger: logger})
	require.NoError(t, err)
	require.NoError(t, s.Check(t.Context()))
	require.Empty(t, rec.All())

	cfg := guarded.Config()
	require.ErrorContains(t, inbox.ConfigurePool(cfg), "already configured")
}
