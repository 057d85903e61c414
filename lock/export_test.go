package lock

// Queued reports the operations waiting for b's next round trip.
func Queued(b *Batcher) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}
