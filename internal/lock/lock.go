package lock

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed obtain.lua
	obtainSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed refresh.lua
	refreshSrc string

	obtainScript  = redis.NewScript(obtainSrc)
	releaseScript = redis.NewScript(releaseSrc)
	refreshScript = redis.NewScript(refreshSrc)
)

var (
	// ErrNotObtained is matched (errors.Is) by the [*HeldError] of an
	// [Obtain] that found the lock held by another.
	ErrNotObtained = errors.New("lock: not obtained")
	// ErrNotHeld is returned by [Lock.Refresh] and [Lock.Release] when the
	// key no longer holds the lock's token: the lock expired, was
	// released, or belongs to another holder now.
	ErrNotHeld = errors.New("lock: not held")
	// ErrLockLost is the cause with which a [Lock.KeepAlive] context is
	// cancelled when a refresh finds the lock gone, or when Redis did not
	// answer before the lock ran out.
	ErrLockLost = errors.New("lock: lost")
	// ErrMaxHoldReached is the cause with which a [Lock.KeepAlive] context
	// is cancelled when the lock has been held for its maxHold.
	ErrMaxHoldReached = errors.New("lock: maximum hold reached")
)

// HeldError is the error of an [Obtain] that found the lock held by
// another: errors.Is(err, ErrNotObtained) reports true for it, and TTL
// says when the holder's lock runs out unless refreshed.
type HeldError struct {
	// Key is the name of the lock.
	Key string
	// TTL is the holder's remaining time to live when the obtain ran;
	// zero for a key without expiry (not set by this package).
	TTL time.Duration
}

func (e *HeldError) Error() string {
	return "lock: not obtained: " + strconv.Quote(e.Key) + " is held by another for " + e.TTL.String()
}

// Is reports whether target is ErrNotObtained.
func (e *HeldError) Is(target error) bool { return target == ErrNotObtained }

// Client is the narrowest Redis client the lock needs: script evaluation.
// Every redis.UniversalClient satisfies it (single, Sentinel, Cluster).
// Build it with ContextTimeoutEnabled, so that a call's deadline bounds a
// hung socket read too.
type Client interface {
	redis.Scripter
}

// fenceTTL is how long a key's fencing counter outlives the last obtain of
// the key: fences of one key increase as long as holders come closer
// together than this.
const fenceTTL = 24 * time.Hour

// RedisKeys returns the Redis keys of the lock named key: the lock and its
// fencing counter. Both carry the hash tag "{key}", so they share one Redis
// Cluster slot and one script can update both.
func RedisKeys(key string) (lockKey, fenceKey string) {
	lockKey = "{" + key + "}"
	return lockKey, lockKey + ":fence"
}

// Lock is a held lock. Its methods are safe for concurrent use; a Lock
// whose TTL ran out is simply no longer held.
type Lock struct {
	client     Client
	key        string
	lockKey    string
	token      string
	fence      int64
	ttl        time.Duration // what a refresh sets
	lease      time.Duration // what the obtain set
	obtainedAt time.Time     // when the obtain was sent
}

// Obtain takes the lock named key, if no one holds it, for lease (for ttl
// when lease is 0 or longer): it sets the key to a random token with SET
// NX PX and, in the same script, increments the key's fencing counter.
// The first refresh ([Lock.Refresh], [Lock.KeepAlive]) extends the lock to
// ttl, so an obtain that ran after its caller gave up (a timeout while
// Redis hung) leaves a lock nobody releases for lease only. When another
// holds the lock it returns a [*HeldError]. A Redis error is wrapped, and
// joined with ctx's error when ctx ended.
func Obtain(ctx context.Context, client Client, key string, ttl, lease time.Duration) (*Lock, error) {
	// An empty key, or one starting with '}', would make the hash tag
	// empty, and a Cluster would hash the lock and its fence apart.
	if key == "" || strings.HasPrefix(key, "}") {
		return nil, fmt.Errorf("lock: invalid key %q (empty or starting with '}')", key)
	}
	if ttl < time.Millisecond || lease < 0 {
		return nil, fmt.Errorf("lock: ttl %s, lease %s: want a ttl of 1ms or more and a lease of 0 or more", ttl, lease)
	}
	if lease < time.Millisecond || lease > ttl {
		lease = ttl
	}
	var b [18]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("lock: token: %w", err)
	}
	l := &Lock{
		client: client, key: key, token: base64.RawURLEncoding.EncodeToString(b[:]),
		ttl: ttl, lease: lease, obtainedAt: time.Now(),
	}
	var fenceKey string
	l.lockKey, fenceKey = RedisKeys(key)
	fence, err := obtainScript.Run(ctx, client, []string{l.lockKey, fenceKey},
		l.token, lease.Milliseconds(), fenceTTL.Milliseconds()).Int64()
	switch {
	case err != nil:
		return nil, joinCtx(ctx, fmt.Errorf("lock: obtain %q: %w", key, err))
	case fence <= 0:
		return nil, &HeldError{Key: key, TTL: time.Duration(-fence) * time.Millisecond}
	}
	l.fence = fence
	return l, nil
}

// Key returns the name the lock was obtained with (not its Redis key; see
// [RedisKeys]).
func (l *Lock) Key() string { return l.key }

// Fence returns the lock's fencing token: a counter that increases with
// each obtain of the key. A system that keeps the largest fence it has
// seen can refuse a paused holder's late write; a Redis fail-over may
// lose the counter with the lock, so nothing may rest on it alone.
func (l *Lock) Fence() int64 { return l.fence }

// Refresh extends the lock to the ttl it was obtained for, only if the key
// still holds this lock's token; otherwise it returns [ErrNotHeld].
func (l *Lock) Refresh(ctx context.Context) error {
	return l.run(ctx, "refresh", refreshScript, l.token, l.ttl.Milliseconds())
}

// Release deletes the lock, only if the key still holds this lock's token
// (compare-and-delete), so a holder whose lock expired never deletes its
// successor's; otherwise it returns [ErrNotHeld].
func (l *Lock) Release(ctx context.Context) error {
	return l.run(ctx, "release", releaseScript, l.token)
}

// run runs a script that answers 1 when the key held the token.
func (l *Lock) run(ctx context.Context, verb string, s *redis.Script, args ...any) error {
	n, err := s.Run(ctx, l.client, []string{l.lockKey}, args...).Int64()
	switch {
	case err != nil:
		return joinCtx(ctx, fmt.Errorf("lock: %s %q: %w", verb, l.key, err))
	case n != 1:
		return ErrNotHeld
	}
	return nil
}

// joinCtx joins ctx's error to err when ctx has ended, so that a caller
// can tell an aborted call from a Redis failure.
func joinCtx(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return errors.Join(err, ctxErr)
	}
	return err
}
