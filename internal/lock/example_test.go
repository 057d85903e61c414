package lock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inboxmq/inboxmq/internal/lock"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// exampleClient connects to the local test Redis.
func exampleClient() *redis.Client {
	opt, err := redis.ParseURL(testenv.RedisURL())
	if err != nil {
		panic(err)
	}
	opt.ContextTimeoutEnabled = true
	return redis.NewClient(opt)
}

func ExampleObtain() {
	ctx := context.Background()
	rdb := exampleClient()
	defer rdb.Close()

	key := "example:invoice:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	lockKey, fenceKey := lock.RedisKeys(key)
	defer rdb.Del(ctx, lockKey, fenceKey)

	first, err := lock.Obtain(ctx, rdb, key, 30*time.Second, 0)
	if err != nil {
		panic(err)
	}
	fmt.Println("first holder, fence", first.Fence())

	_, err = lock.Obtain(ctx, rdb, key, 30*time.Second, 0)
	fmt.Println("second holder:", errors.Is(err, lock.ErrNotObtained))

	if err := first.Release(ctx); err != nil {
		panic(err)
	}
	next, err := lock.Obtain(ctx, rdb, key, 30*time.Second, 0)
	if err != nil {
		panic(err)
	}
	fmt.Println("next holder, fence", next.Fence())
	fmt.Println("stale release:", first.Release(ctx))
	_ = next.Release(ctx)

	// Output:
	// first holder, fence 1
	// second holder: true
	// next holder, fence 2
	// stale release: lock: not held
}

func ExampleLock_KeepAlive() {
	ctx := context.Background()
	rdb := exampleClient()
	defer rdb.Close()

	key := "example:report:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	lockKey, fenceKey := lock.RedisKeys(key)
	defer rdb.Del(ctx, lockKey, fenceKey)

	l, err := lock.Obtain(ctx, rdb, key, 3*time.Second, 0)
	if err != nil {
		panic(err)
	}
	// Refresh every TTL/3, for at most 300ms in all.
	workCtx, stop := l.KeepAlive(ctx, 300*time.Millisecond, 0)
	<-workCtx.Done() // long work, cut short by the cap
	stop()
	fmt.Println(context.Cause(workCtx))
	fmt.Println("release:", l.Release(ctx))

	// Output:
	// lock: maximum hold reached
	// release: <nil>
}
