package lock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrMarked is returned by [Batcher.ObtainUnlessMarked] when the mark
// already holds the value asked for: no lock was taken.
var ErrMarked = errors.New("lock: marked")

// Mark is a key kept beside a lock and read or written in the lock's own
// round trips: a "this job is done" entry that lets a caller skip the lock
// (and the work) altogether. Its key must live in the lock's Redis Cluster
// slot: build it with [MarkKey].
type Mark struct {
	// Key is the mark's Redis key, from [MarkKey].
	Key string
	// Value is what the mark holds once written, and what an obtain
	// compares it with.
	Value string
	// TTL is how long a mark written by [Batcher.ReleaseAndMark] lives; at
	// least 1ms. Ignored by [Batcher.ObtainUnlessMarked].
	TTL time.Duration
}

// markedReply is the obtain script's answer when the mark holds the value.
const markedReply = "marked"

// MarkKey returns the Redis key of a mark named prefix for the lock named
// key: prefix followed by the lock's hash tag "{key}", so the mark shares
// the slot of the lock's keys ([RedisKeys]) and one script can touch all
// of them. prefix must not contain '{' (it would move the hash tag).
func MarkKey(prefix, key string) string {
	return prefix + "{" + key + "}"
}

// validMark checks that m is a mark of the lock named key.
func validMark(key string, m Mark, write bool) error {
	prefix, ok := strings.CutSuffix(m.Key, "{"+key+"}")
	if !ok || strings.Contains(prefix, "{") {
		return fmt.Errorf("lock: mark key %q is not a MarkKey of lock %q", m.Key, key)
	}
	if write && m.TTL < time.Millisecond {
		return fmt.Errorf("lock: mark ttl must be at least 1ms, got %s", m.TTL)
	}
	return nil
}

// ObtainUnlessMarked is [Batcher.Obtain] preceded, in the same script and
// round trip, by a look at mark: when mark.Key holds mark.Value it takes no
// lock and returns [ErrMarked]; otherwise it is exactly Obtain (the lock
// and its fence, or a [*HeldError]).
func (b *Batcher) ObtainUnlessMarked(ctx context.Context, key string, ttl time.Duration, mark Mark) (*Lock, error) {
	if err := validMark(key, mark, false); err != nil {
		return nil, err
	}
	token, err := obtainToken(key, ttl)
	if err != nil {
		return nil, err
	}
	o := &op{key: key, token: token, ttl: ttl, mark: &mark}
	if err := b.do(ctx, o); err != nil {
		return nil, err
	}
	return o.lock, o.err
}

// ReleaseAndMark writes mark (SET with mark.TTL) and releases l by
// compare-and-delete, in one script and round trip shared like
// [Batcher.Release]. The mark is written even when l is no longer held
// ([ErrNotHeld]). A call that is not sent, or gets no answer, may have
// written no mark; its lock is released later like Release's.
func (b *Batcher) ReleaseAndMark(ctx context.Context, l *Lock, mark Mark) error {
	if l == nil {
		return errors.New("lock: release of a nil lock")
	}
	if err := validMark(l.key, mark, true); err != nil {
		return err
	}
	o := &op{release: true, key: l.key, lock: l, mark: &mark}
	if err := b.do(ctx, o); err != nil {
		b.unsettle(l)
		return err
	}
	return o.err
}
