// Package pgserver runs a throwaway PostgreSQL server of the project's
// own: its own data folder under a temporary directory and its own
// loopback port, started from the installed server binaries (as the
// postgres OS user when the caller is root) and stopped by its PID. It is
// for the tests and the chaos kit, which must stop, restart, fence or
// promote a server; the shared one is never touched. internal/pgtest
// wraps it for tests.
package pgserver

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
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is one throwaway PostgreSQL server.
type Server struct {
	// Port is the loopback port it listens on.
	Port int
	base string // the temporary folder; data is its "data"
	dir  string
	bin  string
	cred *syscall.Credential

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	log  lockedBuffer
}

// lockedBuffer is a bytes.Buffer that the server's output goroutine and
// its readers may use at once.
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

// New prepares a server of the binaries in bin ([Binaries]) in a new
// temporary folder, on a free port; nothing runs yet. Remove deletes it.
func New(bin string) (*Server, error) {
	base, err := os.MkdirTemp("", "inboxmq-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}
	port, err := freePort()
	if err != nil {
		_ = os.RemoveAll(base)
		return nil, err
	}
	s := &Server{Port: port, base: base, dir: filepath.Join(base, "data"), bin: bin}
	if os.Geteuid() == 0 { // initdb and postgres refuse root
		u, err := user.Lookup("postgres")
		if err != nil {
			_ = os.RemoveAll(base)
			return nil, fmt.Errorf("pgserver: running as root needs a postgres OS user: %w", err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(base, int(uid), int(gid)); err != nil {
			_ = os.RemoveAll(base)
			return nil, fmt.Errorf("pgserver: %w", err)
		}
	}
	return s, nil
}

// Init creates the server's data folder with initdb (user postgres, trust
// authentication) and configures it: a small, fast server (fsync,
// synchronous_commit and full_page_writes off; wal_level replica, ready
// for standbys), then settings, postgresql.conf lines that override those.
func (s *Server) Init(settings ...string) error {
	if err := s.Run(filepath.Join(s.bin, "initdb"), "-D", s.dir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"); err != nil {
		return err
	}
	return s.Configure(settings...)
}

// Configure appends the server's port, socket folder and settings to its
// postgresql.conf. Among the defaults synchronous_commit = off: a COMMIT
// returns before its WAL is written, and a standby receives it only once
// the WAL writer has flushed it, so a test that promotes a standby must
// first flush the primary's WAL and wait for the standby to replay it.
func (s *Server) Configure(settings ...string) error {
	conf := fmt.Sprintf("\nport = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\n"+
		"fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nshared_buffers = 16MB\nmax_connections = 40\n"+
		"wal_level = replica\nmax_wal_senders = 4\nhot_standby = on\n", s.Port, s.base)
	for _, line := range settings {
		conf += line + "\n"
	}
	f, err := os.OpenFile(filepath.Join(s.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	_, err = f.WriteString(conf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	return nil
}

// Dir is the server's data folder.
func (s *Server) Dir() string { return s.dir }

// Bin is the folder of the server binaries.
func (s *Server) Bin() string { return s.bin }

// URL is a URL of database postgres on the server, for user postgres.
func (s *Server) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.Port)
}

// Start starts the server (again, after Stop) and waits until it accepts
// connections, bounded by ctx.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), "-D", s.dir) //nolint:gosec // the installed binary and the server's own folder
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true}
	cmd.Stdout, cmd.Stderr = &s.log, &s.log
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("pgserver: start postgres: %w", err)
	}
	done := make(chan struct{})
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgx.Connect(cctx, s.URL())
		if err == nil {
			_ = conn.Close(cctx)
			cancel()
			return nil
		}
		cancel()
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-done:
			t.Stop()
			return fmt.Errorf("pgserver: postgres exited at start:\n%s", s.Log())
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("pgserver: postgres did not accept connections: %w\n%s", err, s.Log())
		case <-t.C:
		}
	}
}

// Stop stops the server with a fast shutdown (its sessions end with
// SQLSTATE 57P01) by signalling its PID, and waits until it has exited,
// killing it after wait. Stopping a stopped server does nothing.
func (s *Server) Stop(wait time.Duration) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		_ = cmd.Process.Kill()
		<-done
	}
}

// Remove stops the server and deletes its folder.
func (s *Server) Remove(wait time.Duration) {
	s.Stop(wait)
	_ = os.RemoveAll(s.base)
}

// Log is what the server wrote to its standard output and error.
func (s *Server) Log() string { return s.log.String() }

// Run runs a server binary (initdb, pg_basebackup…) as the server's OS
// user.
func (s *Server) Run(name string, args ...string) error {
	cmd := exec.Command(name, args...) //nolint:gosec // the installed server binaries
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgserver: %s: %w\n%s", filepath.Base(name), err, out)
	}
	return nil
}

// Binaries finds the folder of initdb, postgres and pg_basebackup:
// PG_BINDIR, else the newest /usr/lib/postgresql/<version>/bin, else the
// folder of initdb on PATH.
func Binaries() (string, error) {
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
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgserver: a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil //nolint:forcetypeassert // a TCP listener
}
