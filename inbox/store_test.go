package inbox_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

func TestNewStore_RefusesReadOnlySession(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.Schema(t)
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL())
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	// A hot standby reports pg_is_in_recovery(); a read-only session is the
	// same hazard on a primary and goes through the same check.
	cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	s, err := inbox.NewStore(pool, nil)
	require.NoError(t, err, "NewStore does no I/O")
	err = s.Check(t.Context())
	require.ErrorIs(t, err, inbox.ErrReplica)
	require.ErrorContains(t, err, "primary")
}

func TestNewStore_MissingTable(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Schema(t)
	s, err := inbox.NewStore(pool, &inbox.StoreConfig{Table: "no_such_inbox"})
	require.NoError(t, err, "NewStore does no I/O")
	_, err = s.Get(t.Context(), "payments", "k")
	require.ErrorIs(t, err, inbox.ErrNotChecked, "nothing runs before Check")
	err = s.Check(t.Context())
	require.ErrorIs(t, err, inbox.ErrNoTable)
	require.ErrorContains(t, err, "migrations")
}

func TestNewStore_SchemaQualifiedTable(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	s, err := inbox.NewStore(pool, &inbox.StoreConfig{Table: schema + "." + inbox.DefaultTable})
	if err == nil {
		err = s.Check(t.Context())
	}
	require.NoError(t, err)
	require.Contains(t, s.Table(), `"`+schema+`"`)
}

func TestStoreConfig_Validate(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Schema(t)
	tests := []struct {
		name string
		cfg  *inbox.StoreConfig
	}{
		{"injection", &inbox.StoreConfig{Table: `inbox"; DROP TABLE x; --`}},
		{"three parts", &inbox.StoreConfig{Table: "a.b.c"}},
		{"empty part", &inbox.StoreConfig{Table: "a."}},
		{"crash limit", &inbox.StoreConfig{CrashLimit: -2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := inbox.NewStore(pool, tt.cfg)
			require.Error(t, err)
		})
	}
}

func TestStore_GetNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, err := b.store.Get(t.Context(), "payments", "nope")
	require.ErrorIs(t, err, inbox.ErrNotFound)
}
