package redistest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inboxmq/inboxmq/internal/testenv"
)

// Server is a throwaway redis-server of one test (a data node or a
// Sentinel) on its own loopback port and folder, stopped by its PID when
// the test ends. It is for tests that need a Sentinel, a cluster node or a
// server to fail, which the shared Redis must never be.
type Server struct {
	// Port is the loopback port it listens on.
	Port int
	cmd  *exec.Cmd
	done chan struct{}
	out  lockedBuffer
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.Port) }

// StartServer starts redis-server with conf (redis.conf lines) added to a
// minimal configuration (no persistence) and waits until it answers PING;
// password, when set, is its requirepass.
func StartServer(t testing.TB, password, conf string) *Server {
	t.Helper()
	return start(t, false, password, conf)
}

// StartSentinel starts a Sentinel monitoring the primary named master at
// primary (quorum 1), with sentinelPassword as its own requirepass and
// primaryPassword as the primary's (both may be empty).
func StartSentinel(t testing.TB, master string, primary *Server, primaryPassword, sentinelPassword string) *Server {
	t.Helper()
	conf := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 1000\n", master, primary.Port, master)
	if primaryPassword != "" {
		conf += fmt.Sprintf("sentinel auth-pass %s %s\n", master, primaryPassword)
	}
	return start(t, true, sentinelPassword, conf)
}

func start(t testing.TB, sentinel bool, password, conf string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testenv.Unavailable(t, "Redis", fmt.Errorf("redis-server binary: %w", err))
	}
	dir := t.TempDir()
	s := &Server{Port: freePort(t), done: make(chan struct{})}
	full := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsave \"\"\nappendonly no\n", s.Port, dir)
	if password != "" {
		full += fmt.Sprintf("requirepass %q\n", password)
	}
	full += conf
	path := filepath.Join(dir, "redis.conf")
	if err := os.WriteFile(path, []byte(full), 0o600); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	args := []string{path}
	if sentinel {
		args = append(args, "--sentinel")
	}
	s.cmd = exec.Command(bin, args...) //nolint:gosec // the installed redis-server, the test's own config
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	s.cmd.Stdout, s.cmd.Stderr = &s.out, &s.out
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("redistest: start redis-server: %v", err)
	}
	go func() {
		_ = s.cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() { s.Stop() })

	c := redis.NewClient(&redis.Options{Addr: s.Addr(), Password: password, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(testenv.Timeout())
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return s
		}
		select {
		case <-s.done:
			t.Fatalf("redistest: redis-server exited at start:\n%s", s.out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: redis-server did not answer: %v\n%s", err, s.out.String())
		}
	}
}

// Stop stops the server by signalling its PID and waits until it exited.
// Stopping it again does nothing.
func (s *Server) Stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// StartCluster starts a one-node Redis Cluster that owns every slot and
// waits until its state is ok. It enforces what a larger cluster does: a
// command or script whose keys hash to different slots fails (CROSSSLOT).
func StartCluster(t testing.TB) *Server {
	t.Helper()
	s := StartServer(t, "", "cluster-enabled yes\ncluster-config-file nodes.conf\n")
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
	defer cancel()
	if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatalf("redistest: cluster addslots: %v", err)
	}
	testenv.WaitFor(t, "the one-node cluster's state is ok", func() bool {
		info, err := c.ClusterInfo(ctx).Result()
		return err == nil && bytes.Contains([]byte(info), []byte("cluster_state:ok"))
	})
	return s
}

// lockedBuffer is a bytes.Buffer that the server's output goroutine and the
// test may use at once.
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

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port //nolint:forcetypeassert // a TCP listener
}
