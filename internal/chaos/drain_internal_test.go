package chaos

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// idle counts a running worker's deliveries in flight, which no queue
// depth shows: the drain must not be declared while one is held.
func TestIdleCountsDeliveriesInFlight(t *testing.T) {
	t.Parallel()
	var inFlight atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "# TYPE inboxmq_in_flight gauge\n"+
			"inboxmq_in_flight{consumer=\"c\",queue=\"q\"} %d\n"+
			"inboxmq_in_flight{consumer=\"c2\",queue=\"q2\"} 0\n", inFlight.Load())
	}))
	t.Cleanup(srv.Close)

	dir := t.TempDir()
	bin := filepath.Join(dir, "worker.sh")
	require.NoError(t, os.WriteFile(bin, []byte("#!/bin/sh\nexec sleep 60\n"), 0o755)) //nolint:gosec // an executable test script
	w := &worker{bin: bin, logPath: filepath.Join(dir, "worker.log"), scrape: newScraper(strings.TrimPrefix(srv.URL, "http://"))}
	require.NoError(t, w.start())
	t.Cleanup(w.kill)
	r := &scenarioRun{workers: []*worker{w}}

	require.True(t, r.idle(t.Context()), "nothing in flight")
	inFlight.Store(3)
	require.False(t, r.idle(t.Context()), "three deliveries held")
	inFlight.Store(0)
	require.True(t, r.idle(t.Context()))

	srv.Close()
	require.False(t, r.idle(t.Context()), "a running worker that cannot be scraped may hold deliveries")

	w.kill()
	require.True(t, r.idle(t.Context()), "an exited worker holds nothing")
}
