package held

import "context"

// Advance is advance, for the tests: what the guard does once a released
// message has committed.
func (s *Store) Advance(ctx context.Context, ns, key string, seq int64) error {
	return s.advance(ctx, ns, key, seq)
}
