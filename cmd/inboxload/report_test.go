package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSumMetric(t *testing.T) {
	t.Parallel()
	text := `# HELP inboxmq_duplicate_detected_total Duplicates.
# TYPE inboxmq_duplicate_detected_total counter
inboxmq_duplicate_detected_total{queue="q",source="inbox"} 3
inboxmq_duplicate_detected_total{queue="a} b",source="cache"} 2 1700000000000
# TYPE inboxmq_job_retry_total counter
inboxmq_job_retry_total{queue="q"} 9
# TYPE other untyped
other 1
`
	v, err := sumMetric(strings.NewReader(text), "duplicate_detected_total")
	require.NoError(t, err)
	require.InDelta(t, 5.0, v, 0)

	_, err = sumMetric(strings.NewReader("inboxmq_duplicate_detected_total{queue=\"q\" 3\n"), "duplicate_detected_total")
	require.ErrorContains(t, err, "inboxload: parse metrics")
}

func TestPrintReport(t *testing.T) {
	t.Parallel()
	s := summary{Published: 12, UniqueOrders: 5, ValidCopies: 10, Invalid: 2}
	var out bytes.Buffer
	require.NoError(t, printReport(&out, s, counts{Payments: 5, Ledger: 5, DeadLettered: 2, Duplicates: 5, Elapsed: time.Second}))
	require.Contains(t, out.String(), "OK: exactly one payment and one ledger entry per order")
	require.Contains(t, out.String(), "duplicates detected  5")

	for _, c := range []counts{
		{Payments: 6, Ledger: 6, Duplicates: -1}, // an order paid twice
		{Payments: 5, Ledger: 6, Duplicates: -1}, // a ledger entry booked twice
		{Payments: 4, Ledger: 4, Duplicates: -1}, // an order lost
	} {
		out.Reset()
		require.ErrorIs(t, printReport(&out, s, c), errFailed)
		require.Contains(t, out.String(), "FAIL: ")
	}
}

func TestRunCommandErrors(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	require.ErrorContains(t, runCommand(ctx, nil, nil), "want a command")
	require.ErrorContains(t, runCommand(ctx, []string{"drain"}, nil), `unknown command "drain"`)
	err := runCommand(ctx, []string{"report", "--summary", t.TempDir() + "/none.json"}, nil)
	require.ErrorContains(t, err, "inboxload: report")
	require.NotErrorIs(t, err, errFailed, "an error to run is not a verdict")
}
