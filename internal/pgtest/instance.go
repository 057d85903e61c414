package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxmq/inboxmq/internal/testenv"
)

// Instance is a throwaway PostgreSQL server of one test: its own data
// folder under a temporary directory and its own loopback port, started
// from the installed server binaries (as the postgres OS user when the
// test runs as root) and stopped by its PID when the test ends. It is for
// the tests that must stop, fence or promote a server, which the shared
// one must never be.
type Instance struct {
	// Port is the loopback port it listens on.
	Port int
	dir  string
	bin  string
	cred *syscall.Credential

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	log  lockedBuffer
}

// lockedBuffer is a bytes.Buffer that the server's output goroutine and
// the test may use at once.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// URL is a URL of database postgres on the instance, for user postgres.
func (in *Instance) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", in.Port)
}

// StartPrimary starts a new primary (wal_level replica, ready for
// standbys) and waits until it accepts connections. Each of settings is a
// postgresql.conf line ("max_locks_per_transaction = 64") applied after
// the instance's own, which it overrides.
func StartPrimary(t testing.TB, settings ...string) *Instance {
	t.Helper()
	bin, err := serverBinaries()
	if err != nil {
		// Not a service to reach (testenv.Unavailable's advice): the
		// test starts a server of its own from the installed binaries.
		t.Fatalf("pgtest: this test starts a PostgreSQL server of its own: %v "+
			"(Debian/Ubuntu: apt-get install postgresql; or set PG_BINDIR to the folder of initdb)", err)
	}
	in := newInstance(t, bin)
	in.run(t, filepath.Join(bin, "initdb"), "-D", in.dir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
	in.configure(t, settings...)
	in.Start(t)
	return in
}

// StartStandby copies primary with pg_basebackup -R into a new instance
// and starts it as a streaming standby.
func (in *Instance) StartStandby(t testing.TB) *Instance {
	t.Helper()
	sb := newInstance(t, in.bin)
	sb.run(t, filepath.Join(in.bin, "pg_basebackup"), "-h", "127.0.0.1", "-p", strconv.Itoa(in.Port), "-U", "postgres",
		"-D", sb.dir, "-R", "-X", "stream", "--no-sync")
	sb.configure(t)
	sb.Start(t)
	return sb
}

func newInstance(t testing.TB, bin string) *Instance {
	t.Helper()
	base, err := os.MkdirTemp("", "inboxmq-pg-") //nolint:usetesting // the postgres OS user must reach it; t.TempDir's parent is private
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	in := &Instance{Port: freePort(t), dir: filepath.Join(base, "data"), bin: bin}
	if os.Geteuid() == 0 { // initdb and postgres refuse root
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("pgtest: running as root needs a postgres OS user: %v", err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		in.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(base, int(uid), int(gid)); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
	}
	t.Cleanup(func() {
		in.Stop(t)
		_ = os.RemoveAll(base)
	})
	return in
}

// configure sets the instance's port and the settings a small, fast test
// server needs, then the caller's settings (postgresql.conf lines). Among them synchronous_commit = off: a COMMIT returns
// before its WAL is written, and a standby receives it only once the WAL
// writer has flushed it (within a few wal_writer_delay), so a test that
// promotes a standby must first flush the primary's WAL (a synchronous
// commit of a WAL-logged transaction) and wait for the standby to replay
// up to the flush position.
func (in *Instance) configure(t testing.TB, settings ...string) {
	t.Helper()
	conf := fmt.Sprintf("\nport = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\n"+
		"fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nshared_buffers = 16MB\nmax_connections = 40\n"+
		"wal_level = replica\nmax_wal_senders = 4\nhot_standby = on\n", in.Port, filepath.Dir(in.dir))
	for _, s := range settings {
		conf += s + "\n"
	}
	f, err := os.OpenFile(filepath.Join(in.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	_, err = f.WriteString(conf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
}

// Start starts the server (again, after Stop) and waits until it accepts
// connections.
func (in *Instance) Start(t testing.TB) {
	t.Helper()
	in.mu.Lock()
	cmd := exec.Command(filepath.Join(in.bin, "postgres"), "-D", in.dir) //nolint:gosec // the test's own binary and folder
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: in.cred, Setpgid: true}
	cmd.Stdout, cmd.Stderr = &in.log, &in.log
	if err := cmd.Start(); err != nil {
		in.mu.Unlock()
		t.Fatalf("pgtest: start postgres: %v", err)
	}
	done := make(chan struct{})
	in.cmd, in.done = cmd, done
	in.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	deadline := time.Now().Add(testenv.Timeout())
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, in.URL())
		if err == nil {
			_ = conn.Close(ctx)
			cancel()
			return
		}
		cancel()
		select {
		case <-done:
			t.Fatalf("pgtest: postgres exited at start:\n%s", in.Log())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgtest: postgres did not accept connections: %v\n%s", err, in.Log())
		}
	}
}

// Stop stops the server with a fast shutdown (its sessions end with
// SQLSTATE 57P01) by signalling its PID, and waits until it has exited.
// Stopping a stopped instance does nothing.
func (in *Instance) Stop(t testing.TB) {
	t.Helper()
	in.mu.Lock()
	cmd, done := in.cmd, in.done
	in.cmd = nil
	in.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-done:
	case <-time.After(testenv.Timeout()):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Log is what the server wrote to its standard output and error.
func (in *Instance) Log() string { return in.log.String() }

func (in *Instance) run(t testing.TB, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...) //nolint:gosec // the installed server binaries
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: in.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pgtest: %s: %v\n%s", filepath.Base(name), err, out)
	}
}

// serverBinaries finds the folder of initdb, postgres and pg_basebackup:
// PG_BINDIR, else the newest /usr/lib/postgresql/<version>/bin, else the
// folder of initdb on PATH.
func serverBinaries() (string, error) {
	has := func(dir string) bool {
		for _, b := range []string{"initdb", "postgres", "pg_basebackup"} {
			if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
				return false
			}
		}
		return true
	}
	if dir := os.Getenv("PG_BINDIR"); dir != "" {
		if has(dir) {
			return dir, nil
		}
		return "", fmt.Errorf("PG_BINDIR %s lacks initdb, postgres or pg_basebackup", dir)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	return "", errors.New("no PostgreSQL server binaries (initdb, postgres, pg_basebackup): install the server package or set PG_BINDIR")
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port //nolint:forcetypeassert // a TCP listener
}
