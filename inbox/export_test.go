package inbox

// LeasesQueued reports the claims waiting for s's next shared claim
// statement (claim mode).
func LeasesQueued(s *Store) int { return s.leases.Queued() }

// The log lines of a partitioned inbox whose partitions ran out.
const (
	LogPartitionsCreated    = msgPartitionsCreated
	LogPartitionsNotCreated = msgPartitionsNotCreated
)
