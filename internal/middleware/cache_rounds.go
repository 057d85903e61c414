package middleware

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inboxmq/inboxmq/internal/combine"
)

// cacheRounds sends the completed-cache's GETs and SETs of concurrent
// deliveries in shared round trips (internal/combine, the mechanism of
// claim mode's shared claims): the reads that queue while a read is under
// way go out together in the next pipeline, and so do the writes. A read
// or write that finds none under way is sent at once, alone, as a plain
// command.
// The pipelines are plain ones (no MULTI), so on a Redis Cluster the
// client splits them by node and keys of different slots may share one.
// On a single node (or behind Sentinel) a round of reads is one MGET.
type cacheRounds struct {
	client redis.UniversalClient
	ttl    time.Duration
	// mget: every key lives on the one server the client talks to, so a
	// round of reads can be one MGET (a Cluster or Ring client shards keys).
	mget   bool
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
	_, single := client.(*redis.Client)
	r := &cacheRounds{client: client, ttl: ttl, mget: single}
	r.reads = combine.New(r.sendReads, nil)
	r.writes = combine.New(r.sendWrites, nil)
	return r
}

// get reads key, sharing the round trip with concurrent reads. ctx and
// deadline (the earlier of the two) bound the wait, and the deadline the
// round it is sent in; a read whose ctx ends, or whose deadline passes,
// before it was sent is not sent, and ctx's error (or
// context.DeadlineExceeded) is returned.
func (r *cacheRounds) get(ctx context.Context, deadline time.Time, key string) (string, error) {
	o := &cacheOp{key: key, deadline: earliest(ctx, deadline)}
	if err := r.reads.DoBy(ctx, o.deadline, o); err != nil {
		return "", err
	}
	return o.got, o.err
}

// set writes val at key with the TTL, sharing the round trip with
// concurrent writes; ctx and deadline as for get.
func (r *cacheRounds) set(ctx context.Context, deadline time.Time, key, val string) error {
	o := &cacheOp{key: key, val: val, deadline: earliest(ctx, deadline)}
	if err := r.writes.DoBy(ctx, o.deadline, o); err != nil {
		return err
	}
	return o.err
}

// earliest returns the earlier of ctx's deadline and deadline.
func earliest(ctx context.Context, deadline time.Time) time.Time {
	if d, ok := ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		return d
	}
	return deadline
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
		// MGET of the one key, not GET: a miss is then a nil in the
		// reply, not a redis.Nil error, which the client would run
		// through its retry classification (a dozen allocations).
		o := batch[0]
		o.got, o.err = mgetOne(r.client.MGet(ctx, o.key).Result())
		return
	}
	if r.mget {
		keys := make([]string, len(batch))
		for i, o := range batch {
			keys[i] = o.key
		}
		vals, err := r.client.MGet(ctx, keys...).Result()
		if err == nil && len(vals) != len(batch) {
			err = fmt.Errorf("middleware: cache: MGET of %d keys answered %d values", len(batch), len(vals))
		}
		for i, o := range batch {
			if err != nil {
				o.err = err
				continue
			}
			o.got, o.err = mgetValue(vals[i])
		}
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

// mgetOne returns the answer of an MGET of one key as GET gives it: the
// value, or redis.Nil for a missing key (or one that holds no string).
func mgetOne(vals []any, err error) (string, error) {
	switch {
	case err != nil:
		return "", err
	case len(vals) != 1:
		return "", fmt.Errorf("middleware: cache: MGET of one key answered %d values", len(vals))
	}
	return mgetValue(vals[0])
}

// mgetValue returns one value of an MGET answer as GET gives it.
func mgetValue(v any) (string, error) {
	s, ok := v.(string)
	if !ok {
		return "", redis.Nil
	}
	return s, nil
}
