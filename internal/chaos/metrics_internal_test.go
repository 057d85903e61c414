package chaos

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseMetrics(t *testing.T) {
	t.Parallel()
	text := `# HELP inboxmq_duplicate_detected_total Duplicates.
# TYPE inboxmq_duplicate_detected_total counter
inboxmq_duplicate_detected_total{consumer="q",queue="q",source="inbox"} 3
inboxmq_duplicate_detected_total{consumer="q",queue="q",source="cache"} 4
inboxmq_job_retry_total{queue="q",reason="error"} 2
inboxmq_job_retry_total{queue="q",reason="lock_expired"} 1
inboxmq_job_processing_duration_seconds_bucket{le="0.1"} 5
malformed line
`
	vals, names, series := parseMetrics(strings.NewReader(text))
	require.InDelta(t, 7, vals["duplicate_detected_total"], 0)
	require.InDelta(t, 3, vals["duplicate_detected_total/inbox"], 0)
	require.InDelta(t, 4, vals["duplicate_detected_total/cache"], 0)
	require.InDelta(t, 3, vals["job_retry_total"], 0)
	require.True(t, names["inboxmq_job_processing_duration_seconds_bucket"])
	require.Equal(t, map[string]float64{
		`duplicate_detected_total{source="inbox"}`: 3,
		`duplicate_detected_total{source="cache"}`: 4,
		`job_retry_total{reason="error"}`:          2,
		`job_retry_total{reason="lock_expired"}`:   1,
	}, series, "series without the queue and consumer labels, without buckets")
	require.Equal(t, "inbox", labelValue(`consumer="q",source="inbox"}`, "source"))
	require.Equal(t, "x", labelValue(`source="x"}`, "source"))
	require.Equal(t, "unknown", labelValue(`xsource="y"}`, "source"))

	s := newScraper("127.0.0.1:1")
	s.cur = map[string]float64{"job_retry_total": 2}
	s.restarted()
	s.cur = map[string]float64{"job_retry_total": 1}
	require.InDelta(t, 3, s.totals()["job_retry_total"], 0, "counters survive a restart")
}
