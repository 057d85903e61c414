package testenv

import (
	"slices"
	"time"
)

// MaxInWindow returns the largest number of times that fall within any
// window of length w (half-open: [t, t+w)), for rate-limit assertions.
func MaxInWindow(times []time.Time, w time.Duration) int {
	ts := slices.Clone(times)
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	best, lo := 0, 0
	for hi := range ts {
		for ts[hi].Sub(ts[lo]) >= w {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}
