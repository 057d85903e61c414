package lock

// Queued reports the releases waiting for r's next round trip.
func Queued(r *Releaser) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queue)
}
