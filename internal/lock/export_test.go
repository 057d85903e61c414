package lock

// Queued reports the operations waiting for b's next round trip.
func Queued(b *Batcher) int { return b.rounds.Queued() }
