package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// BuildWorker builds the payment-worker binary from the module rooted at
// repoRoot into dir and returns its path.
func BuildWorker(ctx context.Context, repoRoot, dir string) (string, error) {
	bin := filepath.Join(dir, "payment-worker")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./examples/payment-worker")
	cmd.Dir = repoRoot
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("chaos: build payment-worker: %w\n%s", err, out)
	}
	return bin, nil
}

// RepoRoot walks up from the working directory to the directory holding
// go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("chaos: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("chaos: go.mod not found above the working directory")
		}
		dir = parent
	}
}

// freePort returns a loopback address with a port that was free a moment
// ago.
func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("chaos: free port: %w", err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr, nil
}

// worker is one payment-worker subprocess slot: it is restarted in place
// after a kill, keeping its index, application_name and metrics address.
type worker struct {
	idx     int
	bin     string
	env     []string
	appName string
	metrics string // host:port
	logPath string

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has exited
	exitErr error
	stopped bool // SIGSTOPped
	starts  int
	scrape  *scraper
}

func (w *worker) start() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	logf, err := os.OpenFile(w.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("chaos: worker log: %w", err)
	}
	fmt.Fprintf(logf, "\n==== start %d at %s ====\n", w.starts+1, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(w.bin, "run")
	cmd.Env = append(os.Environ(), w.env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("chaos: start worker %d: %w", w.idx, err)
	}
	w.starts++
	w.cmd, w.stopped = cmd, false
	exited := make(chan struct{})
	w.exited = exited
	go func() {
		err := cmd.Wait()
		_ = logf.Close()
		w.mu.Lock()
		w.exitErr = err
		w.mu.Unlock()
		close(exited)
	}()
	return nil
}

// pid returns the running process's id (0 if none).
func (w *worker) pid() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cmd == nil || w.cmd.Process == nil {
		return 0
	}
	return w.cmd.Process.Pid
}

func (w *worker) signal(sig syscall.Signal) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cmd == nil || w.cmd.Process == nil {
		return errors.New("chaos: worker not running")
	}
	switch sig {
	case syscall.SIGSTOP:
		w.stopped = true
	case syscall.SIGCONT:
		w.stopped = false
	}
	if err := w.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("chaos: signal worker %d: %w", w.idx, err)
	}
	return nil
}

// wait waits for the process to exit within d and returns its exit error.
// With d = 0 it only looks, and a process that has exited is always
// reported so.
func (w *worker) wait(d time.Duration) (exited bool, err error) {
	w.mu.Lock()
	ch := w.exited
	w.mu.Unlock()
	if ch == nil {
		return true, nil
	}
	if d <= 0 {
		select {
		case <-ch:
		default:
			return false, nil
		}
	} else {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ch:
		case <-t.C:
			return false, nil
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return true, w.exitErr
}

// kill SIGKILLs the worker (continuing it first if stopped) and waits for it.
func (w *worker) kill() {
	_ = w.signal(syscall.SIGKILL)
	_, _ = w.wait(10 * time.Second)
}

// ready reports whether the worker answers /readyz with 200.
func (w *worker) ready(ctx context.Context) bool {
	return httpOK(ctx, "http://"+w.metrics+"/readyz")
}

// waitReady polls /readyz until it answers 200 or d passes.
func (w *worker) waitReady(ctx context.Context, d time.Duration) (time.Duration, error) {
	start := time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if w.ready(ctx) {
			return time.Since(start), nil
		}
		w.mu.Lock()
		ch := w.exited
		w.mu.Unlock()
		select {
		case <-ch:
			return time.Since(start), fmt.Errorf("chaos: worker %d exited before it was ready (log %s)", w.idx, w.logPath)
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-tick.C:
		}
		if time.Since(start) > d {
			return time.Since(start), fmt.Errorf("chaos: worker %d not ready after %s (log %s)", w.idx, d, w.logPath)
		}
	}
}

func httpOK(ctx context.Context, url string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// localPorts returns the local TCP ports of the sockets process pid holds,
// read from /proc (Linux).
func localPorts(pid int) (map[int]bool, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, fmt.Errorf("chaos: sockets of %d: %w", pid, err)
	}
	inodes := make(map[string]bool)
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	ports := make(map[int]bool)
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		file, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(file)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || !inodes[fields[9]] {
				continue
			}
			_, portHex, ok := strings.Cut(fields[1], ":")
			if !ok {
				continue
			}
			if p, err := strconv.ParseInt(portHex, 16, 32); err == nil {
				ports[int(p)] = true
			}
		}
		_ = file.Close()
	}
	return ports, nil
}
