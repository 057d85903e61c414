package pgtest

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/inboxmq/inboxmq/internal/pgserver"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// Instance is a throwaway PostgreSQL server of one test (a
// [pgserver.Server]): its own data folder and loopback port, stopped by
// its PID and removed when the test ends. It is for the tests that must
// stop, fence or promote a server, which the shared one must never be.
type Instance struct {
	// Port is the loopback port it listens on.
	Port int
	srv  *pgserver.Server
}

// URL is a URL of database postgres on the instance, for user postgres.
func (in *Instance) URL() string { return in.srv.URL() }

// StartPrimary starts a new primary (wal_level replica, ready for
// standbys) and waits until it accepts connections. Each of settings is a
// postgresql.conf line ("max_locks_per_transaction = 64") applied after
// the instance's own, which it overrides.
func StartPrimary(t testing.TB, settings ...string) *Instance {
	t.Helper()
	bin, err := pgserver.Binaries()
	if err != nil {
		// Not a service to reach (testenv.Unavailable's advice): the
		// test starts a server of its own from the installed binaries.
		t.Fatalf("pgtest: this test starts a PostgreSQL server of its own: %v "+
			"(Debian/Ubuntu: apt-get install postgresql; or set PG_BINDIR to the folder of initdb)", err)
	}
	in := newInstance(t, bin)
	if err := in.srv.Init(settings...); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	in.Start(t)
	return in
}

// StartStandby copies primary with pg_basebackup -R into a new instance
// and starts it as a streaming standby.
func (in *Instance) StartStandby(t testing.TB) *Instance {
	t.Helper()
	sb := newInstance(t, in.srv.Bin())
	if err := sb.srv.Run(filepath.Join(in.srv.Bin(), "pg_basebackup"), "-h", "127.0.0.1", "-p", strconv.Itoa(in.Port), "-U", "postgres",
		"-D", sb.srv.Dir(), "-R", "-X", "stream", "--no-sync"); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if err := sb.srv.Configure(); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	sb.Start(t)
	return sb
}

func newInstance(t testing.TB, bin string) *Instance {
	t.Helper()
	srv, err := pgserver.New(bin)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { srv.Remove(testenv.Timeout()) })
	return &Instance{Port: srv.Port, srv: srv}
}

// Start starts the server (again, after Stop) and waits until it accepts
// connections.
func (in *Instance) Start(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
	defer cancel()
	if err := in.srv.Start(ctx); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
}

// Stop stops the server with a fast shutdown (its sessions end with
// SQLSTATE 57P01) by signalling its PID, and waits until it has exited.
// Stopping a stopped instance does nothing.
func (in *Instance) Stop(t testing.TB) {
	t.Helper()
	in.srv.Stop(testenv.Timeout())
}

// Log is what the server wrote to its standard output and error.
func (in *Instance) Log() string { return in.srv.Log() }
