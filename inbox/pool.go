package inbox

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ConfigurePool makes a pool built from cfg (pgxpool.ParseConfig, then
// pgxpool.NewWithConfig) keep to the writable primary, the only node the
// inbox may use, for as long as the pool lives, across a fail-over:
//
//   - every new connection is checked after it authenticates, and a node
//     in recovery (a standby) or whose sessions are read-only (a fenced or
//     demoted old primary) is refused with [ErrReplica]. With a multi-host
//     URL (host=a,b or postgres://a:5432,b:5432/db) pgx then tries the next
//     host, so new connections land on the primary; with
//     target_session_attrs=read-write the URL asks for the same, and the
//     check still covers URLs without it. A URL that asks for a standby
//     (target_session_attrs read-only, standby or prefer-standby) is an
//     error here.
//   - a connection whose server refuses a write (SQLSTATE 25006: the node
//     became read-only under it) is closed at once, and the pool drops it.
//     Connections that the server shut down (57P01, 57P02) or that broke
//     are closed by pgx as well.
//   - such a refusal or shutdown also retires every connection the pool
//     opened before it: each is dropped the next time it is acquired, and
//     the acquire dials again. After a fail-over all the pool's
//     connections therefore end up on the new primary, at the cost of a
//     failed attempt for the statement that saw the change, not one per
//     connection. An administrator's pg_terminate_backend (57P01) retires
//     them too, which costs only reconnections.
//
// The statement that saw the change fails with an error that [MapError]
// classifies as retryable (db_read_only, db_connection), so the delivery is
// tried again on a fresh connection; a COMMIT whose answer was lost is
// never acked as done (the delivery comes again and the inbox finds the
// key completed if it had committed).
//
// A pool so configured serves the primary: a transaction of its own that
// is read-only and tries to write (25006) is taken for a node that turned
// read-only, and costs the pool its connections.
//
// ConfigurePool keeps the hooks already set on cfg (ValidateConnect,
// OnPgError, AfterConnect, PrepareConn or BeforeAcquire) and runs them as
// well. Call it once per config, before pgxpool.NewWithConfig; a second
// call is an error. [NewStore] checks the primary once at start, and warns
// (StoreConfig.Logger) when its pool was not built through ConfigurePool:
// such a pool works, but its later connections are not checked.
func ConfigurePool(cfg *pgxpool.Config) error {
	if cfg == nil || cfg.ConnConfig == nil {
		return errors.New("inbox: ConfigurePool: nil config (build it with pgxpool.ParseConfig)")
	}
	cc := &cfg.ConnConfig.Config
	if tsa := standbySessionAttrs(cc.ValidateConnect); tsa != "" {
		return fmt.Errorf("inbox: ConfigurePool: target_session_attrs=%s asks for a standby, but the inbox needs the primary "+
			"(use target_session_attrs=read-write or primary)", tsa)
	}
	if configured(cfg) {
		return errors.New("inbox: ConfigurePool: the config is already configured")
	}
	g := &poolGuard{
		prevValidate:     cc.ValidateConnect,
		prevOnPgError:    cc.OnPgError,
		prevAfterConnect: cfg.AfterConnect,
		prevPrepare:      cfg.PrepareConn,
	}
	if samePointer(g.prevValidate, pgconn.ValidateConnectTargetSessionAttrsReadWrite) ||
		samePointer(g.prevValidate, pgconn.ValidateConnectTargetSessionAttrsPrimary) {
		g.prevValidate = nil // validatePrimary checks both in one round trip
	}
	if g.prevPrepare == nil && cfg.BeforeAcquire != nil { //nolint:staticcheck // still honoured by pgxpool, so kept
		before := cfg.BeforeAcquire //nolint:staticcheck // as above
		g.prevPrepare = func(ctx context.Context, conn *pgx.Conn) (bool, error) { return before(ctx, conn), nil }
	}
	cc.ValidateConnect = g.validateConnect
	cc.OnPgError = g.onPgError
	cfg.AfterConnect = g.afterConnect
	cfg.PrepareConn = g.prepareConn
	return nil
}

// configured reports whether cfg (such as a pool's Config()) went through
// [ConfigurePool].
func configured(cfg *pgxpool.Config) bool {
	return cfg != nil && cfg.PrepareConn != nil &&
		reflect.ValueOf(cfg.PrepareConn).Pointer() == reflect.ValueOf((&poolGuard{}).prepareConn).Pointer()
}

// poolGuard holds ConfigurePool's hooks of one pool and the hooks they
// run as well.
type poolGuard struct {
	// generation counts the fail-over signals seen on any connection;
	// connections opened before the last one are retired.
	generation atomic.Int64

	prevValidate     pgconn.ValidateConnectFunc
	prevOnPgError    pgconn.PgErrorHandler
	prevAfterConnect func(context.Context, *pgx.Conn) error
	prevPrepare      func(context.Context, *pgx.Conn) (bool, error)
}

func (g *poolGuard) validateConnect(ctx context.Context, pgConn *pgconn.PgConn) error {
	if g.prevValidate != nil {
		if err := g.prevValidate(ctx, pgConn); err != nil {
			return err
		}
	}
	return validatePrimary(ctx, pgConn)
}

func (g *poolGuard) onPgError(pgConn *pgconn.PgConn, pgErr *pgconn.PgError) bool {
	keep := g.prevOnPgError == nil || g.prevOnPgError(pgConn, pgErr)
	switch pgErr.Code {
	case "25006": // read_only_sql_transaction: the node no longer takes writes
		g.generation.Add(1)
		return false
	case "57P01", "57P02": // admin_shutdown, crash_shutdown: the node goes away
		g.generation.Add(1)
	}
	return keep
}

func (g *poolGuard) afterConnect(ctx context.Context, conn *pgx.Conn) error {
	conn.PgConn().CustomData()[generationKey] = g.generation.Load()
	if g.prevAfterConnect != nil {
		return g.prevAfterConnect(ctx, conn)
	}
	return nil
}

func (g *poolGuard) prepareConn(ctx context.Context, conn *pgx.Conn) (bool, error) {
	if gen, ok := conn.PgConn().CustomData()[generationKey].(int64); ok && gen < g.generation.Load() {
		return false, nil // opened before a fail-over signal: dial again
	}
	if g.prevPrepare != nil {
		return g.prevPrepare(ctx, conn)
	}
	return true, nil
}

// generationKey holds, in a connection's CustomData, the guard's
// generation when it was opened.
const generationKey = "inboxmq.inbox.generation"

// validatePrimary refuses a node in recovery or whose sessions are
// read-only (what NewStore checks at start).
func validatePrimary(ctx context.Context, pgConn *pgconn.PgConn) error {
	res, err := pgConn.Exec(ctx, "SELECT pg_is_in_recovery(), current_setting('transaction_read_only')").ReadAll()
	if err != nil {
		return err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 2 {
		return errors.New("inbox: check primary: unexpected answer")
	}
	row := res[0].Rows[0]
	if string(row[0]) == "t" || string(row[1]) == "on" {
		return ErrReplica
	}
	return nil
}

// standbySessionAttrs names the target_session_attrs that v selects when it
// is one of pgx's validators of a standby, else "".
func standbySessionAttrs(v pgconn.ValidateConnectFunc) string {
	for name, f := range map[string]pgconn.ValidateConnectFunc{
		"read-only":      pgconn.ValidateConnectTargetSessionAttrsReadOnly,
		"standby":        pgconn.ValidateConnectTargetSessionAttrsStandby,
		"prefer-standby": pgconn.ValidateConnectTargetSessionAttrsPreferStandby,
	} {
		if samePointer(v, f) {
			return name
		}
	}
	return ""
}

// samePointer reports whether v is the top-level function f (what
// pgconn.ParseConfig sets for a target_session_attrs).
func samePointer(v, f pgconn.ValidateConnectFunc) bool {
	return v != nil && reflect.ValueOf(v).Pointer() == reflect.ValueOf(f).Pointer()
}
