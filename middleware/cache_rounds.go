package middleware

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inboxmq/inboxmq/internal/combine"
)

// cacheRounds sends the completed-cache's GETs and SETs of concurrent
// deliveries in shared round trips (internal/combine, the mechanism of the
// lock's Batcher): the reads that queue while a read is under way go out
// together in the next pipeline, and so do the writes. A read or write
// that finds none under way is sent at once, alone, as a plain command.
// The pipelines are plain ones (no MULTI), so on a Redis Cluster the
// client splits them by node and keys of different slots may share one.
type cacheRounds struct {
	client redis.UniversalClient
	ttl    time.Duration
	reads  *combine.Combiner[*cacheOp]
	writes *combine.Combiner[*cacheOp]
}

// cacheOp is one GET, or one SET of val, and its answer. deadline is the
// caller's: a round ends by the earliest deadline of its operations, so
// no caller waits past its own.
type cacheOp struct {
	key, val string
	deadline time.Time

	got string // GET's answer
	err error  // the command's error (redis.Nil for a GET miss)
}

func newCacheRounds(client redis.UniversalClient, ttl time.Duration) *cacheRounds {
	r := &cacheRounds{client: client, ttl: ttl}
	r.reads = combine.New(r.sendReads, nil)
	r.writes = combine.New(r.sendWrites, nil)
	return r
}

// get reads key, sharing the round trip with concurrent reads. ctx bounds
// the wait (its deadline also bounds the round it is sent in); a read
// whose ctx ends before it was sent is not sent, and ctx's error is
// returned.
func (r *cacheRounds) get(ctx context.Context, key string) (string, error) {
	o := &cacheOp{key: key}
	o.deadline, _ = ctx.Deadline()
	if err := r.reads.Do(ctx, o); err != nil {
		return "", err
	}
	return o.got, o.err
}

// set writes val at key with the TTL, sharing the round trip with
// concurrent writes; ctx as for get.
func (r *cacheRounds) set(ctx context.Context, key, val string) error {
	o := &cacheOp{key: key, val: val}
	o.deadline, _ = ctx.Deadline()
	if err := r.writes.Do(ctx, o); err != nil {
		return err
	}
	return o.err
}

// roundContext bounds a round by the earliest deadline of batch.
func roundContext(batch []*cacheOp) (context.Context, context.CancelFunc) {
	var first time.Time
	for _, o := range batch {
		if !o.deadline.IsZero() && (first.IsZero() || o.deadline.Before(first)) {
			first = o.deadline
		}
	}
	if first.IsZero() {
		return context.WithCancel(context.Background())
	}
	return context.WithDeadline(context.Background(), first)
}

func (r *cacheRounds) sendReads(batch []*cacheOp) {
	ctx, cancel := roundContext(batch)
	defer cancel()
	if len(batch) == 1 {
		o := batch[0]
		o.got, o.err = r.client.Get(ctx, o.key).Result()
		return
	}
	pipe := r.client.Pipeline()
	cmds := make([]*redis.StringCmd, len(batch))
	for i, o := range batch {
		cmds[i] = pipe.Get(ctx, o.key)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	for i, o := range batch {
		o.got, o.err = cmds[i].Result()
	}
}

func (r *cacheRounds) sendWrites(batch []*cacheOp) {
	ctx, cancel := roundContext(batch)
	defer cancel()
	if len(batch) == 1 {
		o := batch[0]
		o.err = r.client.Set(ctx, o.key, o.val, r.ttl).Err()
		return
	}
	pipe := r.client.Pipeline()
	cmds := make([]*redis.StatusCmd, len(batch))
	for i, o := range batch {
		cmds[i] = pipe.Set(ctx, o.key, o.val, r.ttl)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	for i, o := range batch {
		o.err = cmds[i].Err()
	}
}
