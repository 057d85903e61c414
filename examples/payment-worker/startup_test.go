package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/testenv"
)

// silentServer listens on loopback, accepts every connection and never
// answers: a database or broker that hangs after the TCP handshake. It
// returns its address; the listener and the connections close at cleanup.
func silentServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// A service that accepts TCP and never answers does not hang start-up:
// the worker logs what it waits for, serves /healthz (and a /readyz that
// names the missing service) meanwhile, and exits non-zero after
// CONNECT_TIMEOUT with an error naming the service, never its password.
func TestStartupGivesUpOnAServiceThatNeverAnswers(t *testing.T) {
	t.Parallel()
	const timeout = 8 * time.Second
	tests := []struct {
		service string
		env     func(addr string) string
		migrate bool // the database must be ready to get as far as the service
	}{
		{"PostgreSQL", func(addr string) string {
			return "DATABASE_URL=postgres://app:s3cret@" + addr + "/payments?sslmode=disable"
		}, false},
		{"RabbitMQ", func(addr string) string { return "AMQP_URL=amqp://guest:s3cret@" + addr + "/" }, true},
	}
	for _, tt := range tests {
		t.Run(tt.service, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tt.env(silentServer(t)), "CONNECT_TIMEOUT="+timeout.String())
			if tt.migrate {
				b.migrate(t)
			}
			addr := freeAddr(t)
			stderr := &syncBuffer{}
			cmd := exec.Command(b.binary, "run")
			cmd.Env = append(append([]string{}, b.env...), "METRICS_ADDR="+addr)
			cmd.Stderr = stderr
			started := time.Now()
			require.NoError(t, cmd.Start())
			var waitErr error
			exited := make(chan struct{})
			go func() {
				waitErr = cmd.Wait()
				close(exited)
			}()
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				<-exited
				if t.Failed() {
					t.Logf("worker log:\n%s", tail(stderr.String(), 40))
				}
			})

			// While it waits: alive, not ready, and saying what is missing.
			testenv.WaitFor(t, "/readyz names the service being waited for", func() bool {
				code, body := httpGet("http://" + addr + "/readyz")
				return code == http.StatusServiceUnavailable && strings.Contains(body, "waiting for "+tt.service)
			})
			code, _ := httpGet("http://" + addr + "/healthz")
			require.Equal(t, http.StatusOK, code, "/healthz answers while the worker waits")
			require.Contains(t, stderr.String(), `"msg":"waiting for `+tt.service+` at `)

			select {
			case <-exited:
			case <-time.After(timeout + 20*time.Second):
				t.Fatalf("the worker still waits %s after start (CONNECT_TIMEOUT=%s)", time.Since(started), timeout)
			}
			var exitErr *exec.ExitError
			require.True(t, errors.As(waitErr, &exitErr), "the worker exits non-zero: %v", waitErr)
			require.GreaterOrEqual(t, time.Since(started), timeout, "it waited CONNECT_TIMEOUT")
			logs := stderr.String()
			require.Regexp(t, `payment-worker: `+tt.service+` at \S+ did not answer within `+timeout.String()+` \(CONNECT_TIMEOUT\)`, logs)
			require.NotContains(t, logs, "s3cret", "the password is never logged")
		})
	}
}

// migrate gives up on a database that never answers, too.
func TestMigrateGivesUpOnADatabaseThatNeverAnswers(t *testing.T) {
	t.Parallel()
	b := setup(t, "DATABASE_URL=postgres://app:s3cret@"+silentServer(t)+"/payments?sslmode=disable", "CONNECT_TIMEOUT=2s")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.binary, "migrate")
	cmd.Env = b.env
	out, err := cmd.CombinedOutput()
	require.NoError(t, ctx.Err(), "migrate still waits after 30s (CONNECT_TIMEOUT=2s)")
	var exitErr *exec.ExitError
	require.True(t, errors.As(err, &exitErr), "migrate exits non-zero: %v", err)
	require.Regexp(t, `PostgreSQL at \S+ did not answer within 2s \(CONNECT_TIMEOUT\)`, string(out))
	require.NotContains(t, string(out), "s3cret")
}

// A missing or unknown command exits 1 and says which commands there are.
func TestUnknownCommandExitsOne(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{nil, {"serve"}, {"run", "now"}} {
		out, err := exec.CommandContext(t.Context(), workerBinary(t), args...).CombinedOutput()
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr, "%v: %s", args, out)
		require.Equal(t, 1, exitErr.ExitCode(), "%v", args)
		require.Contains(t, string(out), "want migrate or run", "%v", args)
	}
}
