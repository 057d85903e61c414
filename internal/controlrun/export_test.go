package controlrun

import "time"

// SetHeartbeatInterval makes h beat every d (before Start), so that a test
// sees its refreshes without waiting the production interval.
func SetHeartbeatInterval(h *Heartbeat, d time.Duration) { h.interval = d }

// SetBreaker writes b as a worker's breaker reporter does.
var SetBreaker = setBreaker
