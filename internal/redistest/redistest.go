// Package redistest gives each test a Redis client and a key prefix of its
// own, and deletes the test's keys when it ends (never FLUSHDB, so tests run
// in parallel). It is for tests only; production code never imports it.
package redistest

import (
	"context"
	"fmt"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inboxmq/inboxmq/internal/testenv"
)

var (
	counter     atomic.Int64
	unsafeChars = regexp.MustCompile(`[^A-Za-z0-9]+`)
)

// Client returns a client for the test Redis and a key prefix unique to this
// test ("t:<n>:<name>:<unix-nano>:"). Keys under the prefix are deleted when
// the test ends, as are keys that merely contain it (such as the lock
// package's hash-tagged "{<prefix>…}" keys). The client has
// ContextTimeoutEnabled set.
func Client(t testing.TB) (redis.UniversalClient, string) {
	t.Helper()
	opt, err := redis.ParseURL(testenv.RedisURL())
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	// Respect context deadlines on socket reads too, as production clients
	// of the lock and middleware should.
	opt.ContextTimeoutEnabled = true
	c := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		testenv.Unavailable(t, "Redis", err)
	}
	prefix := fmt.Sprintf("t:%d:%s:%d:", counter.Add(1), unsafeChars.ReplaceAllString(t.Name(), "_"), time.Now().UnixNano())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		iter := c.Scan(ctx, 0, "*"+prefix+"*", 500).Iterator()
		for iter.Next(ctx) {
			_ = c.Del(ctx, iter.Val()).Err()
		}
		_ = c.Close()
	})
	return c, prefix
}
