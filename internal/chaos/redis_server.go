package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// redisServer is a Redis server of the run's own, on a free loopback port
// and in a folder of its own, so that the redis-restart fault never
// touches a server the run did not start. It is stopped by its PID.
type redisServer struct {
	port int
	dir  string
	cmd  *exec.Cmd
}

// startRedisServer starts redis-server in dir on a free port and waits
// until it answers.
func startRedisServer(ctx context.Context, dir string) (*redisServer, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("chaos: the redis-restart fault runs a Redis server of its own and needs redis-server on the PATH (apt-get install redis-server): %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("chaos: a free port for Redis: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port //nolint:forcetypeassert // a TCP listener's address
	_ = l.Close()
	s := &redisServer{port: port, dir: dir}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	return s, s.start(ctx)
}

// URL is the server's redis:// URL.
func (s *redisServer) URL() string { return "redis://127.0.0.1:" + strconv.Itoa(s.port) + "/0" }

func (s *redisServer) start(ctx context.Context) error {
	//nolint:gosec // fixed arguments: the port and folder are the run's own
	cmd := exec.Command("redis-server", "--bind", "127.0.0.1", "--port", strconv.Itoa(s.port),
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--logfile", filepath.Join(s.dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("chaos: start redis-server: %w", err)
	}
	s.cmd = cmd
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(s.port), 200*time.Millisecond); err == nil {
			_ = c.Close()
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("chaos: redis-server on port %d exited at start (log: %s)", s.port, filepath.Join(s.dir, "redis.log"))
		case <-ctx.Done():
			s.stop()
			return fmt.Errorf("chaos: redis-server: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stop()
			return errors.New("chaos: redis-server did not answer within 10s")
		}
	}
}

// stop kills the server by its PID and waits for it to exit.
func (s *redisServer) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	for range 100 {
		if s.cmd.Process.Signal(syscall.Signal(0)) != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.cmd = nil
}

// restart is the redis-restart fault: the server dies (nothing is saved),
// stays down for down, and starts again on the same port, empty.
func (s *redisServer) restart(ctx context.Context, down time.Duration) error {
	s.stop()
	t := time.NewTimer(down)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
	}
	// Always start it again, even if ctx ended: the workers use it.
	return s.start(context.WithoutCancel(ctx))
}
