package inbox

// LeasesQueued reports the claims waiting for s's next shared claim
// statement (claim mode).
func LeasesQueued(s *Store) int { return s.leases.Queued() }
