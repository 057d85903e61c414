package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/testenv"
)

func TestLoopback(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"127.0.0.1:9470": true, "[::1]:9470": true, "localhost:0": true, "127.3.4.5:1": true,
		"0.0.0.0:9470": false, ":9470": false, "10.0.0.1:9470": false, "example.com:80": false, "nonsense": false,
	} {
		require.Equal(t, want, loopback(addr), addr)
	}
}

func TestUI_RefusesRemoteAddress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.run(t, "ui", "--addr", "0.0.0.0:0")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.errOut, "--allow-remote")
	r = b.run(t, "ui", "--queue", "bad name")
	require.Equal(t, exitUsage, r.code)
}

// syncBuffer is a bytes.Buffer safe for the server's writes and the
// test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// inboxctl ui serves the console on loopback with a generated token that
// it prints once, audits each change on stderr, and stops with its
// context.
func TestUI_ServesWithGeneratedToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ready := make(chan string, 1)
	uiReady = func(addr string) { ready <- addr }
	ctx, cancel := context.WithCancel(t.Context())
	var errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"ui", "--addr", "127.0.0.1:0", "--queue", "payments"}, io.Discard, &errOut, func(k string) string { return b.env[k] })
	}()
	addr := testenv.WaitChan(t, ready, "the console listening")
	m := regexp.MustCompile(`operator token \(printed once\): (\S+)`).FindStringSubmatch(errOut.String())
	require.NotNil(t, m, errOut.String())

	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string) (int, string) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+addr+path, nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}
	status, page := get("/")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, `<tr data-queue="payments">`)
	require.NotContains(t, page, "guest:guest")

	form := url.Values{"operator": {"alice"}, "token": {m[1]}}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+addr+"/login", bytes.NewBufferString(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := client.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, "the printed token signs in")
	require.Regexp(t, `"msg":"ui: audit","action":"login","result":"ok"`, errOut.String())

	cancel()
	require.Equal(t, exitOK, testenv.WaitChan(t, done, "inboxctl ui stopped"))
}
