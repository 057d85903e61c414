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
	//go:embed pttl.lua
	pttlSrc string
	//go:embed mark_check.lua
	markCheckSrc string
	//go:embed mark_set.lua
	markSetSrc string

	obtainScript  = redis.NewScript(obtainSrc)
	releaseScript = redis.NewScript(releaseSrc)
	refreshScript = redis.NewScript(refreshSrc)
	pttlScript    = redis.NewScript(pttlSrc)

	// The marked variants run their prefix, then the plain script
	// unchanged: one source for each rule.
	obtainUnlessMarkedScript = redis.NewScript(markCheckSrc + obtainSrc)
	releaseAndMarkScript     = redis.NewScript(markSetSrc + releaseSrc)
)

// Client is the narrowest Redis client the lock needs: script evaluation.
// Every redis.UniversalClient satisfies it (*redis.Client, a Sentinel-backed
// failover client, *redis.ClusterClient and *redis.Ring), so single,
// Sentinel and Cluster deployments all work. Each script touches the keys of
// one hash slot only (see [RedisKeys]).
//
// For a Locker's per-call deadlines to bound a hung socket read as well as
// the wait for a pooled connection, build the client with
// ContextTimeoutEnabled set.
type Client interface {
	redis.Scripter
}

// DefaultFenceTTL is the default of Config.FenceTTL.
const DefaultFenceTTL = 24 * time.Hour

// Config configures a [Locker]. A nil *Config means defaults.
type Config struct {
	// FenceTTL is how long a key's fencing counter survives after the last
	// Obtain of that key. Fencing tokens of one key strictly increase as long
	// as the gap between two holders is shorter than FenceTTL, so it must
	// exceed the longest hold. Defaults to DefaultFenceTTL (24h); -1 keeps
	// counters forever (one small key per lock key).
	FenceTTL time.Duration
	// Lease, when set, caps the time to live an obtain sets: a lock asked
	// for a longer ttl first lives for Lease, and its first refresh
	// ([Lock.KeepAlive], or [Lock.Refresh] with a zero ttl) extends it to
	// the ttl asked for. An obtain that the caller gave up on (a timeout
	// while Redis hung) can still run in Redis later, when nobody will
	// release what it set; with a Lease such a lock is gone after Lease
	// instead of after its full ttl. Set it only if every lock is kept
	// alive or refreshed within Lease. Defaults to 0: an obtain sets the
	// full ttl.
	Lease time.Duration
}

func (c *Config) withDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.FenceTTL == 0 {
		out.FenceTTL = DefaultFenceTTL
	}
	return out
}

func (c Config) validate() error {
	if c.FenceTTL < 0 && c.FenceTTL != -1 {
		return fmt.Errorf("lock: FenceTTL must be positive or -1, got %s", c.FenceTTL)
	}
	if c.FenceTTL > 0 && c.FenceTTL < time.Millisecond {
		return fmt.Errorf("lock: FenceTTL must be at least 1ms, got %s", c.FenceTTL)
	}
	if c.Lease < 0 || (c.Lease > 0 && c.Lease < time.Millisecond) {
		return fmt.Errorf("lock: Lease must be 0 or at least 1ms, got %s", c.Lease)
	}
	return nil
}

// lease is the TTL an obtain for ttl sets.
func (c Config) lease(ttl time.Duration) time.Duration {
	if c.Lease > 0 && c.Lease < ttl {
		return c.Lease
	}
	return ttl
}

// Locker obtains locks from one Redis deployment. It holds no state besides
// its client and configuration and is safe for concurrent use.
type Locker struct {
	client Client
	cfg    Config
}

// New returns a Locker using client. A nil cfg means defaults; an invalid
// cfg is an error.
func New(client Client, cfg *Config) (*Locker, error) {
	if client == nil {
		return nil, errors.New("lock: nil client")
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &Locker{client: client, cfg: c}, nil
}

// ObtainOpts are per-call options of [Locker.Obtain]. A nil *ObtainOpts
// means a single attempt.
type ObtainOpts struct {
	// Wait is how long Obtain keeps trying while the lock is held by
	// another. Defaults to 0: a single attempt.
	Wait time.Duration
	// RetryInterval is the pause between attempts within Wait. Defaults to
	// 25ms.
	RetryInterval time.Duration
}

func (o *ObtainOpts) wait() time.Duration {
	if o == nil || o.Wait < 0 {
		return 0
	}
	return o.Wait
}

func (o *ObtainOpts) retryInterval() time.Duration {
	if o == nil || o.RetryInterval <= 0 {
		return 25 * time.Millisecond
	}
	return o.RetryInterval
}

// RedisKeys returns the Redis keys that back the lock named key: the lock
// itself and its fencing counter. Both carry the hash tag "{key}", so they
// live in one Redis Cluster slot and one script can update both atomically.
func RedisKeys(key string) (lockKey, fenceKey string) {
	lockKey = "{" + key + "}"
	return lockKey, lockKey + ":fence"
}

func validKey(key string) error {
	// An empty key, or one starting with '}', would make the hash tag empty,
	// and Redis Cluster would then hash the two keys apart.
	if key == "" || strings.HasPrefix(key, "}") {
		return fmt.Errorf("lock: invalid key %q (empty or starting with '}')", key)
	}
	return nil
}

// Obtain tries to take the lock named key for ttl (at least 1ms; see
// Config.Lease). It sets the key only if it does not exist to a random
// token, and atomically with it increments the key's fencing counter. When
// another holder has the lock it retries within opts.Wait, then returns a
// [*HeldError] (errors.Is [ErrNotObtained]). A Redis error is returned
// wrapped; if ctx ended, its error is joined.
//
// An obtain that got no answer (a timeout) may still run in Redis later;
// nobody releases the lock it then sets, which lives for its lease
// (Config.Lease). A [Batcher] also releases such locks by their token once
// Redis answers again.
func (l *Locker) Obtain(ctx context.Context, key string, ttl time.Duration, opts *ObtainOpts) (*Lock, error) {
	token, err := obtainToken(key, ttl)
	if err != nil {
		return nil, err
	}
	lockKey, fenceKey := RedisKeys(key)
	fenceTTL := l.fenceTTLMillis()
	lease := l.cfg.lease(ttl)

	var deadline time.Time
	if w := opts.wait(); w > 0 {
		deadline = time.Now().Add(w)
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		start := time.Now()
		fence, err := obtainScript.Run(ctx, l.client, []string{lockKey, fenceKey}, token, lease.Milliseconds(), fenceTTL).Int64()
		if err != nil {
			return nil, joinCtx(ctx, fmt.Errorf("lock: obtain %q: %w", key, err))
		}
		if fence > 0 {
			return l.newLock(key, token, fence, ttl, start), nil
		}
		held := newHeldError(key, fence)
		wait := opts.retryInterval()
		if deadline.IsZero() || time.Until(deadline) < wait {
			return nil, held
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return nil, errors.Join(held, ctx.Err())
		case <-timer.C:
		}
	}
}

// fenceTTLMillis is the obtain script's fence TTL argument (0: none).
func (l *Locker) fenceTTLMillis() int64 {
	if l.cfg.FenceTTL > 0 {
		return l.cfg.FenceTTL.Milliseconds()
	}
	return 0
}

// newLock is the Lock an obtain for ttl sent at sent returned fence for.
func (l *Locker) newLock(key, token string, fence int64, ttl time.Duration, sent time.Time) *Lock {
	lockKey, _ := RedisKeys(key)
	return &Lock{
		locker: l, key: key, lockKey: lockKey, token: token, fence: fence,
		ttl: ttl, lease: l.cfg.lease(ttl), obtainedAt: sent,
	}
}

// Lock is a held lock. Its methods are safe for concurrent use; the lock
// itself lives in Redis, so a Lock whose TTL ran out is simply no longer
// held (its methods then return [ErrNotHeld]).
type Lock struct {
	locker     *Locker
	key        string
	lockKey    string
	token      string
	fence      int64
	ttl        time.Duration // what refreshes set by default
	lease      time.Duration // what the obtain set (see Config.Lease)
	obtainedAt time.Time
}

// Key returns the name the lock was obtained with (not the Redis key; see
// [RedisKeys]).
func (l *Lock) Key() string { return l.key }

// Token returns the random token that identifies this holder.
func (l *Lock) Token() string { return l.token }

// Fence returns the lock's fencing token: a counter that strictly increases
// with each Obtain of the same key (see Config.FenceTTL). Pass it to the
// system you write to, which rejects writes carrying a smaller fence than
// one it has already seen, so a holder that lost the lock while paused
// cannot write over its successor.
func (l *Lock) Fence() int64 { return l.fence }

// ObtainedAt returns when the successful obtain call was sent: unless
// released or refreshed, the lock expires no earlier than ObtainedAt plus
// the TTL it was obtained for, or plus Config.Lease when that is shorter.
func (l *Lock) ObtainedAt() time.Time { return l.obtainedAt }

// TTL returns the lock's remaining time to live. It returns [ErrNotHeld]
// when the key no longer holds this lock's token (expired, released or
// taken by another).
func (l *Lock) TTL(ctx context.Context) (time.Duration, error) {
	ms, err := pttlScript.Run(ctx, l.locker.client, []string{l.lockKey}, l.token).Int64()
	if err != nil {
		return 0, joinCtx(ctx, fmt.Errorf("lock: ttl %q: %w", l.key, err))
	}
	if ms < 0 {
		// -3: another token; -2: no key. -1 (no expiry) never happens for
		// keys set by Obtain.
		return 0, ErrNotHeld
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// Refresh extends the lock to ttl from now, by compare-and-pexpire: only if
// the key still holds this lock's token. A zero ttl reuses the TTL the lock
// was obtained with. It returns [ErrNotHeld] when the lock is gone.
func (l *Lock) Refresh(ctx context.Context, ttl time.Duration) error {
	if ttl == 0 {
		ttl = l.ttl
	}
	if ttl < time.Millisecond {
		return fmt.Errorf("lock: ttl must be at least 1ms, got %s", ttl)
	}
	n, err := refreshScript.Run(ctx, l.locker.client, []string{l.lockKey}, l.token, ttl.Milliseconds()).Int64()
	if err != nil {
		return joinCtx(ctx, fmt.Errorf("lock: refresh %q: %w", l.key, err))
	}
	if n != 1 {
		return ErrNotHeld
	}
	return nil
}

// Release deletes the lock by compare-and-delete: only if the key still
// holds this lock's token, so a holder whose lock expired never deletes its
// successor's. It returns [ErrNotHeld] when the lock was already gone.
func (l *Lock) Release(ctx context.Context) error {
	return releasedAnswer(ctx, l, l.release(ctx))
}

func (l *Lock) release(ctx context.Context) *redis.Cmd {
	return releaseScript.Run(ctx, l.locker.client, []string{l.lockKey}, l.token)
}

// obtainToken checks an obtain's key and ttl and returns its new token.
func obtainToken(key string, ttl time.Duration) (string, error) {
	if err := validKey(key); err != nil {
		return "", err
	}
	if ttl < time.Millisecond {
		return "", fmt.Errorf("lock: ttl must be at least 1ms, got %s", ttl)
	}
	return newToken()
}

func newToken() (string, error) {
	var b [18]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("lock: token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// joinCtx joins ctx's error to err when ctx has ended, so callers can tell
// an aborted call from a Redis failure.
func joinCtx(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return errors.Join(err, ctxErr)
	}
	return err
}

// String describes the lock for logs: key, fence and a token prefix.
func (l *Lock) String() string {
	return "lock " + strconv.Quote(l.key) + " fence " + strconv.FormatInt(l.fence, 10) + " token " + l.token[:6] + "…"
}
