package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// buildWorker builds examples/payment-worker into dir, as an operator does
// (a plain go build from the module's root), and returns the binary's path.
func buildWorker(ctx context.Context, dir string) (string, error) {
	gomod, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	bin := filepath.Join(dir, "payment-worker")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./examples/payment-worker")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./examples/payment-worker: %w\n%s", err, out)
	}
	return bin, nil
}

// workerSettings are the payment-worker's settings (its config struct in
// examples/payment-worker/main.go). The worker's environment drops them
// all, whatever this process was started with, so the worker runs at its
// defaults but for the ones a variant sets.
var workerSettings = []string{
	"AMQP_URL", "DATABASE_URL", "REDIS_URL", "PAYMENT_QUEUE", "PAYMENT_EVENTS_EXCHANGE", "GATEWAY_URL",
	"LOCK", "LOCK_TTL", "WORKER_CONCURRENCY", "GROUP_COMMIT", "FAULT_EVENTS", "METRICS_ADDR",
	"CONNECT_TIMEOUT", "QUEUE_TYPE", "DELIVERY_LIMIT", "ORDERED_SHARDS", "BREAKER", "BREAKER_WINDOW",
	"BREAKER_THRESHOLD", "BREAKER_MIN_CALLS", "BREAKER_COOLDOWN", "GATEWAY_RATE_LIMIT", "GATEWAY_WORKERS",
}

// workerEnv is this process's environment without the worker's settings
// and tracing (OTEL_*), plus set.
func workerEnv(set ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "OTEL_") && !slices.Contains(workerSettings, name) {
			env = append(env, kv)
		}
	}
	return append(env, set...)
}

// process is one `payment-worker run`.
type process struct {
	cmd  *exec.Cmd
	log  *os.File
	addr string // METRICS_ADDR: /readyz
	done chan struct{}
	err  error // cmd.Wait's, once done is closed
}

// startWorker runs `bin run` with env and METRICS_ADDR on a free port,
// its log (zap JSON on stderr) appended to logPath.
func startWorker(bin, logPath string, env []string) (*process, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	p := &process{cmd: exec.Command(bin, "run"), log: log, addr: addr, done: make(chan struct{})}
	p.cmd.Env = slices.Concat(env, []string{"METRICS_ADDR=" + addr})
	p.cmd.Stdout, p.cmd.Stderr = log, log
	if err := p.cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("payment-worker run: %w", err)
	}
	go func() {
		p.err = p.cmd.Wait()
		_ = log.Close()
		close(p.done)
	}()
	return p, nil
}

// waitReady waits until the worker's /readyz answers 200: its topology is
// declared and it consumes.
func (p *process) waitReady(ctx context.Context, timeout time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+"/readyz", http.NoBody)
		if err != nil {
			return err
		}
		if resp, err := client.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("payment-worker exited before it was ready: %w\n%s", cmp.Or(p.err, errors.New("exit status 0")), p.tail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("payment-worker not ready within %s\n%s", timeout, p.tail())
		}
	}
}

// stop sends SIGTERM and waits for the exit (30 s, the worker's own bound,
// then SIGKILL); an exit status other than 0 is an error.
func (p *process) stop() error {
	select {
	case <-p.done:
		return p.exitErr()
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-p.done:
		return p.exitErr()
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("payment-worker did not exit within 30s of SIGTERM\n%s", p.tail())
	}
}

func (p *process) exitErr() error {
	if p.err != nil {
		return fmt.Errorf("payment-worker: %w\n%s", p.err, p.tail())
	}
	return nil
}

// tail returns the last lines of the worker's log.
func (p *process) tail() string {
	b, err := os.ReadFile(p.log.Name())
	if err != nil {
		return ""
	}
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	return string(bytes.Join(lines[max(0, len(lines)-20):], []byte("\n")))
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
