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

func ExampleLocker_Obtain() {
	ctx := context.Background()
	rdb := exampleClient()
	defer rdb.Close()

	locker, err := lock.New(rdb, nil)
	if err != nil {
		panic(err)
	}
	key := "example:invoice:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	lockKey, fenceKey := lock.RedisKeys(key)
	defer rdb.Del(ctx, lockKey, fenceKey)

	first, err := locker.Obtain(ctx, key, 30*time.Second, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("first holder, fence", first.Fence())

	_, err = locker.Obtain(ctx, key, 30*time.Second, nil)
	fmt.Println("second holder:", errors.Is(err, lock.ErrNotObtained))

	if err := first.Release(ctx); err != nil {
		panic(err)
	}
	next, err := locker.Obtain(ctx, key, 30*time.Second, nil)
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

	locker, err := lock.New(rdb, nil)
	if err != nil {
		panic(err)
	}
	key := "example:report:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	lockKey, fenceKey := lock.RedisKeys(key)
	defer rdb.Del(ctx, lockKey, fenceKey)

	l, err := locker.Obtain(ctx, key, 3*time.Second, nil)
	if err != nil {
		panic(err)
	}
	// Refresh every TTL/3, for at most 300ms in all.
	workCtx, stop := l.KeepAlive(ctx, &lock.KeepAliveOpts{MaxHold: 300 * time.Millisecond})
	<-workCtx.Done() // long work, cut short by the cap
	stop()
	fmt.Println(context.Cause(workCtx))
	fmt.Println("release:", l.Release(ctx))

	// Output:
	// lock: maximum hold reached
	// release: <nil>
}

func ExampleBatcher() {
	ctx := context.Background()
	rdb := exampleClient()
	defer rdb.Close()

	locker, err := lock.New(rdb, nil)
	if err != nil {
		panic(err)
	}
	// Workers obtain and release through one Batcher; operations that
	// coincide share a round trip.
	batcher, err := lock.NewBatcher(locker, nil)
	if err != nil {
		panic(err)
	}
	key := "example:receipt:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	_, fenceKey := lock.RedisKeys(key)
	defer rdb.Del(ctx, fenceKey)

	l, err := batcher.Obtain(ctx, key, 30*time.Second)
	if err != nil {
		panic(err)
	}
	fmt.Println("fence:", l.Fence())
	_, err = batcher.Obtain(ctx, key, 30*time.Second)
	var held *lock.HeldError
	fmt.Println("second holder:", errors.Is(err, lock.ErrNotObtained), errors.As(err, &held) && held.TTL > 0)
	fmt.Println("released:", batcher.Release(ctx, l))
	fmt.Println("again:", batcher.Release(ctx, l))

	// Output:
	// fence: 1
	// second holder: true true
	// released: <nil>
	// again: lock: not held
}
