package middleware_test

import (
	"cmp"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/middleware"
	"github.com/inboxmq/inboxmq/retry"
)

// Two workers get a copy of the same job at the same time: the second finds
// the key locked and is deferred, without running its handler.
func ExampleLock() {
	ctx := context.Background()
	opt, err := redis.ParseURL(cmp.Or(os.Getenv("TEST_REDIS_URL"), "redis://127.0.0.1:6379/9"))
	if err != nil {
		panic(err)
	}
	opt.ContextTimeoutEnabled = true // lets the middleware's call timeouts bound socket reads
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	// A key prefix of this example's own; its keys are deleted at the end.
	prefix := fmt.Sprintf("example:%d:", time.Now().UnixNano())
	defer func() {
		iter := rdb.Scan(context.Background(), 0, "*"+prefix+"*", 100).Iterator()
		for iter.Next(context.Background()) {
			rdb.Del(context.Background(), iter.Val())
		}
	}()

	// In a worker: HandlerOpts{Middleware: []inboxtype.Middleware{lockMW}}.
	lockMW, err := middleware.Lock(rdb, &middleware.LockOpts{Prefix: prefix, RetryDelay: time.Second})
	if err != nil {
		panic(err)
	}
	// copyOf is a decoded delivery of the job, as Register hands it to
	// handler middleware.
	copyOf := func() *inboxtype.Delivery {
		d := inboxtype.NewDelivery("payments", "payments", "worker-1", &amqp.Delivery{Body: []byte(`{"order_id":"order-42"}`)})
		d.Key = "order-42"
		return d
	}

	inHandler := make(chan struct{})
	finish := make(chan struct{})
	done := make(chan error)
	go func() {
		done <- lockMW(func(ctx context.Context, d *inboxtype.Delivery) error {
			fmt.Println("first worker:", d.LockResult, "fence", d.LockFence)
			close(inHandler)
			<-finish // the first worker is busy with order-42
			return nil
		})(ctx, copyOf())
	}()
	<-inHandler

	// A copy of the same message reaches a second worker meanwhile.
	d := copyOf()
	err = lockMW(func(context.Context, *inboxtype.Delivery) error {
		fmt.Println("never runs")
		return nil
	})(ctx, d)
	dec := retry.Classify(err)
	fmt.Println("second worker:", d.LockResult, dec.Kind, dec.Reason, dec.Delay)

	close(finish)
	fmt.Println("first worker returned:", <-done)

	// Output:
	// first worker: acquired fence 1
	// second worker: held retry lock_unavailable 1s
	// first worker returned: <nil>
}

// The completed-cache acks a redelivery of a completed job without reaching
// the inbox; another job reusing the key goes on to the inbox, which judges
// it.
func ExampleCache() {
	ctx := context.Background()
	opt, err := redis.ParseURL(cmp.Or(os.Getenv("TEST_REDIS_URL"), "redis://127.0.0.1:6379/9"))
	if err != nil {
		panic(err)
	}
	opt.ContextTimeoutEnabled = true // lets the middleware's call timeouts bound socket reads
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	// A key prefix of this example's own; its keys are deleted at the end.
	prefix := fmt.Sprintf("example:%d:", time.Now().UnixNano())
	defer func() {
		iter := rdb.Scan(context.Background(), 0, "*"+prefix+"*", 100).Iterator()
		for iter.Next(context.Background()) {
			rdb.Del(context.Background(), iter.Val())
		}
	}()

	// In a worker: HandlerOpts{Middleware: []inboxtype.Middleware{cache}}.
	cache := middleware.Cache(rdb, &middleware.CacheOpts{Prefix: prefix, TTL: time.Minute})
	handler := cache(func(_ context.Context, d *inboxtype.Delivery) error {
		fmt.Printf("inbox handler: %s\n", d.Body) // in a real worker: the inbox handler
		return nil
	})
	// job is a decoded delivery of the job {"order_id": "order-42",
	// "amount_cents": amount}, its Key and Fingerprint set as Register sets
	// them.
	job := func(amount int) *inboxtype.Delivery {
		body := fmt.Appendf(nil, `{"order_id":"order-42","amount_cents":%d}`, amount)
		d := inboxtype.NewDelivery("payments", "payments", "worker-1", &amqp.Delivery{Body: body})
		d.Key = "order-42"
		sum := sha256.Sum256(body)
		d.Fingerprint = sum[:]
		return d
	}

	fmt.Println("first delivery:", handler(ctx, job(100)))
	dec := retry.Classify(handler(ctx, job(100)))
	fmt.Println("redelivery:", dec.Kind, "from", dec.Source)
	// Another job reusing the key is not the cache's to judge: it reaches
	// the inbox, which dead-letters it as a key conflict.
	_ = handler(ctx, job(200))

	// Output:
	// inbox handler: {"order_id":"order-42","amount_cents":100}
	// first delivery: <nil>
	// redelivery: duplicate from cache
	// inbox handler: {"order_id":"order-42","amount_cents":200}
}

// A handler that honours its context is cut off at the timeout, and the
// delivery is retried.
func ExampleTimeout() {
	handler := middleware.Timeout(10 * time.Millisecond)(func(ctx context.Context, _ *inboxtype.Delivery) error {
		<-ctx.Done() // a call that honours ctx
		return ctx.Err()
	})
	d := inboxtype.NewDelivery("payments", "payments", "worker-1", &amqp.Delivery{})
	dec := retry.Classify(handler(context.Background(), d))
	fmt.Println(dec.Kind, dec.Reason)

	// Output:
	// retry timeout
}

// The lock with the completed-cache in front: the first delivery takes the
// lock and, once completed, writes the entry; its redelivery is a
// duplicate found by the cache, and takes no lock.
func ExampleLock_withCache() {
	ctx := context.Background()
	opt, err := redis.ParseURL(cmp.Or(os.Getenv("TEST_REDIS_URL"), "redis://127.0.0.1:6379/9"))
	if err != nil {
		panic(err)
	}
	opt.ContextTimeoutEnabled = true // lets the middleware's call timeouts bound socket reads
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	// A key prefix of this example's own; its keys are deleted at the end.
	prefix := fmt.Sprintf("example:%d:", time.Now().UnixNano())
	defer func() {
		iter := rdb.Scan(context.Background(), 0, "*"+prefix+"*", 100).Iterator()
		for iter.Next(context.Background()) {
			rdb.Del(context.Background(), iter.Val())
		}
	}()

	cacheMW := middleware.Cache(rdb, &middleware.CacheOpts{Prefix: prefix + "done:", TTL: time.Minute})
	lockMW, err := middleware.Lock(rdb, &middleware.LockOpts{Prefix: prefix + "lock:"})
	if err != nil {
		panic(err)
	}
	handler := cacheMW(lockMW(func(_ context.Context, d *inboxtype.Delivery) error {
		fmt.Println("inbox handler, lock", d.LockResult) // in a real worker: the inbox handler
		return nil
	}))
	job := func() *inboxtype.Delivery {
		body := []byte(`{"order_id":"order-42","amount_cents":100}`)
		d := inboxtype.NewDelivery("payments", "payments", "worker-1", &amqp.Delivery{Body: body})
		d.Key = "order-42"
		sum := sha256.Sum256(body)
		d.Fingerprint = sum[:]
		return d
	}

	fmt.Println("first delivery:", handler(ctx, job()))
	again := job()
	dec := retry.Classify(handler(ctx, again))
	fmt.Printf("redelivery: %s from %s, lock %q\n", dec.Kind, dec.Source, again.LockResult)

	// Output:
	// inbox handler, lock acquired
	// first delivery: <nil>
	// redelivery: duplicate from cache, lock ""
}
