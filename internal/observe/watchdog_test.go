package observe_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/observe"
)

// The watchdog fails only while work is in flight and the last progress
// is older than the threshold, and then says since when and the threshold.
// The inputs are an hour or more apart from the threshold, so the result
// never depends on how fast the test runs.
func TestWatchdog_FailsOnlyPastTheThreshold(t *testing.T) {
	t.Parallel()
	now := time.Now()
	tests := []struct {
		name      string
		inFlight  int
		last      time.Time
		threshold time.Duration
		fails     bool
	}{
		{name: "stuck past the threshold", inFlight: 2, last: now.Add(-3 * time.Hour), threshold: time.Hour, fails: true},
		{name: "in flight within the threshold", inFlight: 2, last: now, threshold: time.Hour},
		{name: "idle", inFlight: 0, last: now.Add(-3 * time.Hour), threshold: time.Hour},
		{name: "no progress yet", inFlight: 1, threshold: time.Hour},
		{name: "disabled", inFlight: 2, last: now.Add(-3 * time.Hour), threshold: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			check := observe.Watchdog("consumer", func() (int, time.Time) { return tt.inFlight, tt.last }, tt.threshold)
			err := check.Func(t.Context())
			if !tt.fails {
				require.NoError(t, err)
				return
			}
			var ce *observe.CheckError
			require.ErrorAs(t, err, &ce)
			// The age is measured when the check runs: at least the 3h the
			// input is old, rounded to the second.
			require.Regexp(t, `^observe: consumer: 2 deliveries in flight and none settled for 3h0m[0-9]+s$`, ce.Error())
			require.Equal(t, tt.last, ce.Since)
			require.Equal(t, tt.threshold, ce.Threshold)
		})
	}
}
