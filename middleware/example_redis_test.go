package middleware_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/lock"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/middleware"
	"github.com/inboxmq/inboxmq/retry"
)

// exampleRedis connects to the local test Redis and returns a key prefix
// unique to this run.
func exampleRedis() (*redis.Client, string) {
	opt, err := redis.ParseURL(testenv.RedisURL())
	if err != nil {
		panic(err)
	}
	opt.ContextTimeoutEnabled = true // lets the middleware's call timeouts bound socket reads
	return redis.NewClient(opt), "example:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
}

// exampleDelivery is a decoded delivery of consumer "payments" with key,
// whose fingerprint is that of the job {"order_id": key, "amount_cents": 100}.
func exampleDelivery(key string) *inboxtype.Delivery {
	return exampleJob(key, 100)
}

// exampleJob is a decoded delivery of the job {"order_id": key,
// "amount_cents": amount}, its Key and Fingerprint set as Register sets
// them.
func exampleJob(key string, amount int) *inboxtype.Delivery {
	body := fmt.Appendf(nil, `{"order_id":%q,"amount_cents":%d}`, key, amount)
	d := inboxtype.NewDelivery("payments", "payments", "worker-1", &amqp.Delivery{Body: body})
	d.Key = key
	sum := sha256.Sum256(body)
	d.Fingerprint = sum[:]
	return d
}

func ExampleLock() {
	ctx := context.Background()
	rdb, prefix := exampleRedis()
	defer rdb.Close()

	// In a real worker: HandlerOpts{Middleware: []inboxtype.Middleware{lockMW}}.
	lockKey, fenceKey := lock.RedisKeys(prefix + "payments:order-42")
	defer rdb.Del(ctx, lockKey, fenceKey)

	lockMW, err := middleware.Lock(rdb, &middleware.LockOpts{Prefix: prefix, RetryDelay: time.Second})
	if err != nil {
		panic(err)
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
		})(ctx, exampleDelivery("order-42"))
	}()
	<-inHandler

	// A copy of the same message reaches a second worker meanwhile.
	d := exampleDelivery("order-42")
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

func ExampleCache() {
	ctx := context.Background()
	rdb, prefix := exampleRedis()
	defer rdb.Close()
	defer rdb.Del(ctx, prefix+"payments:order-42")

	cache := middleware.Cache(rdb, &middleware.CacheOpts{Prefix: prefix, TTL: time.Minute})
	handler := cache(func(_ context.Context, d *inboxtype.Delivery) error {
		fmt.Printf("inbox handler: %s\n", d.Body) // in a real worker: the inbox handler
		return nil
	})

	fmt.Println("first delivery:", handler(ctx, exampleJob("order-42", 100)))
	dec := retry.Classify(handler(ctx, exampleJob("order-42", 100)))
	fmt.Println("redelivery:", dec.Kind, "from", dec.Source)
	// Another job reusing the key is not the cache's to judge: it reaches
	// the inbox, which dead-letters it as a key conflict.
	_ = handler(ctx, exampleJob("order-42", 200))

	// Output:
	// inbox handler: {"order_id":"order-42","amount_cents":100}
	// first delivery: <nil>
	// redelivery: duplicate from cache
	// inbox handler: {"order_id":"order-42","amount_cents":200}
}

func ExampleTimeout() {
	handler := middleware.Timeout(10 * time.Millisecond)(func(ctx context.Context, _ *inboxtype.Delivery) error {
		<-ctx.Done() // a call that honours ctx
		return ctx.Err()
	})
	dec := retry.Classify(handler(context.Background(), exampleDelivery("order-42")))
	fmt.Println(dec.Kind, dec.Reason)

	// Output:
	// retry timeout
}
