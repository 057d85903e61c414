package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// An ordered route runs on each session as:
//
//   - one shard loop per shard queue: its own channel and a consumer with
//     single active consumer, so the broker delivers a shard to one worker
//     at a time; the loop admits each delivery to its key's lane;
//   - a lane per ordering key (the delivery's routing key), shared by the
//     route's workers: a key's deliveries run one after another, in the
//     order they arrived, on the worker that ran the first; different keys
//     run in parallel up to the route's concurrency;
//   - a members consumer on "<queue>.members", so that the number of
//     workers is that queue's consumer count;
//   - a rebalancer that gives up the shards this worker is active on
//     beyond its fair share: the shard loop stops dispatching, waits for
//     the shard's deliveries in flight to settle, then closes its channel
//     (the broker returns what was prefetched to the queue, in order, and
//     activates the next consumer in line) and subscribes again, at the
//     end of the line;
//   - the same reset of a shard's subscription after a delivery of the
//     shard was settled other than for good (requeued, abandoned): the
//     deliveries the shard handed out after it are returned to the queue
//     behind it, instead of running before its redelivery.

// shardSub is one shard queue's consumption on one session.
type shardSub struct {
	queue string
	// active: a delivery came on the current subscription, so this worker
	// is the shard's single active consumer.
	active atomic.Bool
	// handover, when signalled, makes the shard loop give the shard up.
	handover chan struct{}
	// reset is set when a delivery of the current subscription was settled
	// other than for good (requeued, abandoned). The broker redelivers it
	// behind what it already handed out on the channel, so nothing more
	// may be dispatched: the subscription ends as on a handover, and
	// closing the channel puts every unsettled delivery back at its place
	// (a classic queue; on a quorum queue the prefetch of 1 leaves none
	// but the requeued one). It is set before the delivery's lane is
	// released and read after each admission, under the lanes' lock in
	// between, so the key's next delivery is never dispatched ahead.
	reset atomic.Bool
	// inflight counts the shard's deliveries admitted and not yet settled.
	inflight sync.WaitGroup
	// fair is the route's share of a fair route's slots (nil when the
	// route is ordered): the loop hands deliveries to it, not to lanes.
	fair *fairShare
}

// requestReset makes the shard loop end its subscription (see reset).
func (sh *shardSub) requestReset() {
	sh.reset.Store(true)
	select { // wakes the loop if it waits
	case sh.handover <- struct{}{}:
	default:
	}
}

// lanes serialises the deliveries of each ordering key of a route.
type lanes struct {
	mu sync.Mutex
	m  map[string][]job // key present: a worker runs it; the slice waits
}

func newLanes() *lanes { return &lanes{m: make(map[string][]job)} }

// admit returns true when j may run now (its key was idle; the key is now
// busy); otherwise j waits behind the key's running delivery.
func (l *lanes) admit(j job) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if q, busy := l.m[j.key]; busy {
		l.m[j.key] = append(q, j)
		return false
	}
	l.m[j.key] = nil
	return true
}

// next returns the key's next waiting delivery, or false once there is
// none (the key is then idle).
func (l *lanes) next(key string) (job, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.m[key]
	if len(q) == 0 {
		delete(l.m, key)
		return job{}, false
	}
	j := q[0]
	q[0] = job{}
	l.m[key] = q[1:]
	return j, true
}

// runLane runs the deliveries that wait behind j's key, in order, after
// j was settled with action (and finished). Once a delivery of the key is
// not settled for good (requeued or abandoned), the ones behind it are
// returned to the queue too, so that none overtakes it; so are those left
// when Stop was called. The key's deliveries not yet admitted stay
// unsettled: the shard's reset returns them (see shardSub.reset).
func (c *Consumer) runLane(r *route, j *job, action inboxtype.Action) {
	if j.shard == nil {
		return
	}
	sess := j.sess
	for {
		next, ok := r.lanes.next(j.key)
		if !ok {
			return
		}
		if next.sess != sess {
			// The first of a new session: what came before it was on a
			// channel that is gone, and is redelivered ahead of it.
			sess, action = next.sess, inboxtype.ActionAcked
		}
		switch {
		case next.sess.gone():
			// The broker redelivers it with the rest of its channel's.
			action = inboxtype.ActionAbandoned
		case !settledForGood(action), c.stopRequested():
			_ = next.requeue()
			action = inboxtype.ActionRequeued
		default:
			c.progress.begin()
			action = c.process(r, &next)
			c.progress.end()
		}
		next.finish(action)
	}
}

func (c *Consumer) stopRequested() bool {
	select {
	case <-c.stopCh:
		return true
	default:
		return false
	}
}

// retryOrdered retries a failed delivery of an ordered route in process
// under the route's policy, each pause capped by Ordered.MaxRetryDelay,
// until it succeeds, fails for good, or the policy gives up (the decision
// returned is then still a retry: settle dead-letters it as exhausted).
// stopped reports that Stop, or the end of the delivery's session, cut a
// pause short.
func (c *Consumer) retryOrdered(ctx context.Context, r *route, j *job, d *inboxtype.Delivery, settled func(inboxtype.Outcome), err error, cls retry.Decision, rn *runs) (dec retry.Decision, stopped bool) {
	opts := &r.Opts
	dec = decide(ctx, err, cls)
	for dec.Kind == retry.KindRetry {
		delay := dec.Delay
		if !dec.Uncounted {
			next, ok := opts.Policy.NextDelay(d.Attempt, dec.Err)
			if !ok {
				return dec, false
			}
			delay = max(delay, next)
		}
		delay = min(max(delay, time.Millisecond), opts.Ordered.MaxRetryDelay)
		for _, o := range c.cfg.Observers {
			o.OnInProcessRetry(d, dec, delay)
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-c.stopCh:
			t.Stop()
			return dec, true
		case <-j.sess.failed:
			t.Stop()
			return dec, true
		}
		settled(inboxtype.Outcome{
			Decision: dec, Action: inboxtype.ActionRetriedInProcess, Delay: delay,
			Duration: time.Since(d.ReceivedAt), Handled: rn.last, InProcessRetries: rn.inProcess(),
		})
		rn.tries++
		if !dec.Uncounted {
			d.Attempt++
		}
		err = c.call(ctx, r.Handler, d, &rn.last)
		dec = decide(ctx, err, retry.Classify(err, opts.Rules...))
	}
	return dec, false
}

// orderingKey is the key whose deliveries run one at a time: the routing
// key the message was published with to the route's exchange.
func orderingKey(raw *amqp.Delivery) string { return raw.RoutingKey }

// openOrdered starts route r's shard loops, members consumer and
// rebalancer on session s.
func (s *session) openOrdered(r *route) {
	o := r.Opts.Ordered
	var fair *fairShare
	if o.Fair {
		fair = newFairShare(o.Weights)
		s.loops.Add(1)
		go s.fairLoop(r, fair)
	}
	shards := make([]*shardSub, o.Shards)
	for i := range shards {
		shards[i] = &shardSub{queue: ShardQueueName(r.Queue, i), handover: make(chan struct{}, 1), fair: fair}
		s.loops.Add(1)
		go s.shardLoop(r, shards[i])
	}
	if fair != nil {
		return // every worker consumes every shard: nothing to count or hand over
	}
	s.loops.Add(2)
	go s.member(r)
	go s.rebalance(r, shards)
}

// watchErr fails the session when ch closes with an error; a close of our
// own (a handover) is no failure.
func (s *session) watchErr(what string, closed <-chan *amqp.Error) {
	go func() {
		select {
		case err, ok := <-closed:
			if ok && err != nil {
				s.fail(fmt.Errorf("consumer: %s closed: %w", what, err))
			}
		case <-s.failed:
		}
	}()
}

// shardEnd says why a shard loop stopped dispatching.
type shardEnd int

const (
	endHandover shardEnd = iota // rebalance or pause: subscribe again
	endStop                     // Stop
	endFailed                   // the session failed
)

// shardLoop consumes one shard queue for the session's lifetime,
// subscribing again after each handover.
func (s *session) shardLoop(r *route, sh *shardSub) {
	defer s.loops.Done()
	for {
		if !s.waitResumed(r) {
			return
		}
		ch, deliveries, err := s.subscribeShard(r, sh)
		if err != nil {
			s.fail(err)
			return
		}
		acks := newAcker(ch, &s.c.acks)
		end := s.pumpShard(r, sh, acks, deliveries)
		sh.active.Store(false)
		// The shard's deliveries in flight settle first; closing the
		// channel then returns the prefetched rest to the queue, ahead of
		// anything the next active consumer receives.
		s.waitInflight(sh)
		_ = ch.Close()
		if end != endHandover || s.c.stopRequested() {
			return
		}
		// Every delivery of the old subscription is settled: no reset is
		// requested for the new one yet, and a handover requested while
		// draining is served.
		sh.reset.Store(false)
		select {
		case <-sh.handover:
		default:
		}
	}
}

func (s *session) subscribeShard(r *route, sh *shardSub) (*amqp.Channel, <-chan amqp.Delivery, error) {
	ch, err := s.conn.Channel()
	if err != nil {
		return nil, nil, fmt.Errorf("consumer: open channel for %q: %w", sh.queue, err)
	}
	if err := ch.Qos(shardPrefetch(r.Opts.Queue, r.Opts.Ordered), 0, false); err != nil {
		return nil, nil, fmt.Errorf("consumer: set prefetch on %q: %w", sh.queue, err)
	}
	s.watchErr("channel of "+sh.queue, ch.NotifyClose(make(chan *amqp.Error, 1)))
	s.watchCancel(sh.queue, ch.NotifyCancel(make(chan string, 1)))
	deliveries, err := ch.Consume(sh.queue, s.c.consumerTag(sh.queue), false, false, false, false, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("consumer: consume %q: %w", sh.queue, err)
	}
	return ch, deliveries, nil
}

// shardPrefetch is the prefetch of a shard's channel. A classic queue
// puts the unacked messages of a departing consumer back at their places,
// so the next consumer receives them in queue order. A quorum queue
// (RabbitMQ 3.10) returns them in another order: two messages prefetched
// and not started when a worker hands the shard over (or crashes) could
// swap. With one message outstanding per shard there is never more than
// one to return, at the price of one delivery at a time per shard.
func shardPrefetch(q QueueOpts, o *OrderedOpts) int {
	if q.Type == Quorum && !o.Fair {
		return 1
	}
	return q.Prefetch
}

// pumpShard admits the shard's deliveries to their keys' lanes and hands
// those whose key is idle to the route's workers, until a handover, a
// reset, a pause, Stop or the session's end.
func (s *session) pumpShard(r *route, sh *shardSub, acks *acker, deliveries <-chan amqp.Delivery) shardEnd {
	for {
		paused, changed := r.pauseState()
		if paused {
			return endHandover
		}
		select { // Stop wins over a ready delivery
		case <-s.stopConsuming:
			return endStop
		default:
		}
		select {
		case raw, ok := <-deliveries:
			if !ok {
				s.fail(fmt.Errorf("consumer: deliveries of %q ended (channel closed or consumer cancelled)", sh.queue))
				return endFailed
			}
			sh.active.Store(true)
			// Tracked before any worker can settle it (see acker).
			acks.track(raw.DeliveryTag)
			if sh.reset.Load() {
				return endHandover // left unsettled: the close returns it
			}
			j := job{raw: raw, sess: s, acks: acks, shard: sh, key: orderingKey(&raw)}
			sh.inflight.Add(1)
			if sh.fair != nil {
				j.fair = sh.fair
				sh.fair.push(j)
				continue
			}
			if !r.lanes.admit(j) {
				continue // waits behind its key
			}
			if sh.reset.Load() {
				// Its key's lane was idle, perhaps released by the
				// requeue that asked for the reset: it must not run
				// ahead of that delivery's redelivery.
				releaseLane(r, sh, j)
				return endHandover
			}
			if end, ok := s.dispatch(r, sh, j, changed); !ok {
				return end
			}
		case <-sh.handover:
			return endHandover
		case <-changed:
		case <-s.stopConsuming:
			return endStop
		case <-s.failed:
			return endFailed
		}
	}
}

// dispatch hands j to a worker. If a handover, a pause, Stop or the
// session's end comes first, j stays unsettled (closing the channel
// returns it to the queue) and its key is released.
func (s *session) dispatch(r *route, sh *shardSub, j job, changed <-chan struct{}) (shardEnd, bool) {
	end := endHandover
	select {
	case r.jobs <- j:
		return 0, true
	case <-sh.handover:
	case <-changed:
	case <-s.stopConsuming:
		end = endStop
	case <-s.failed:
		end = endFailed
	}
	releaseLane(r, sh, j)
	return end, false
}

// releaseLane releases the lane of j, admitted and not dispatched: j stays
// unsettled (closing the channel returns it to the queue).
func releaseLane(r *route, sh *shardSub, j job) {
	// Nothing waits behind j: this loop alone admits the key's deliveries.
	for {
		if _, ok := r.lanes.next(j.key); !ok {
			break
		}
		sh.inflight.Done()
	}
	sh.inflight.Done()
}

// waitInflight waits until the shard's admitted deliveries are settled,
// or the session fails (its deliveries are then redelivered anyway).
func (s *session) waitInflight(sh *shardSub) {
	done := make(chan struct{})
	go func() {
		sh.inflight.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-s.failed:
	}
}

// member keeps this worker counted in the route's members queue while the
// route is not paused.
func (s *session) member(r *route) {
	defer s.loops.Done()
	queue := membersQueueName(r.Queue)
	for {
		if !s.waitResumed(r) {
			return
		}
		ch, err := s.conn.Channel()
		if err != nil {
			s.fail(fmt.Errorf("consumer: open channel for %q: %w", queue, err))
			return
		}
		s.watchErr("channel of "+queue, ch.NotifyClose(make(chan *amqp.Error, 1)))
		// No message is ever published there; any that is, is dropped.
		deliveries, err := ch.Consume(queue, s.c.consumerTag(queue), true, false, false, false, nil)
		if err != nil {
			s.fail(fmt.Errorf("consumer: consume %q: %w", queue, err))
			return
		}
		if !s.holdMembership(r, deliveries) {
			_ = ch.Close()
			return
		}
		_ = ch.Close()
	}
}

// holdMembership returns true when the route was paused and false when
// the session ends.
func (s *session) holdMembership(r *route, deliveries <-chan amqp.Delivery) bool {
	for {
		paused, changed := r.pauseState()
		if paused {
			return true
		}
		select {
		case _, ok := <-deliveries:
			if !ok {
				s.fail(fmt.Errorf("consumer: consumer of %q ended", membersQueueName(r.Queue)))
				return false
			}
		case <-changed:
		case <-s.stopConsuming:
			return false
		case <-s.failed:
			return false
		}
	}
}

// rebalance periodically gives up the shards this worker holds beyond
// its fair share.
func (s *session) rebalance(r *route, shards []*shardSub) {
	defer s.loops.Done()
	every := r.Opts.Ordered.RebalanceInterval
	if every < 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-s.stopConsuming:
			return
		case <-s.failed:
			return
		}
		workers, err := s.countMembers(r)
		if err != nil {
			s.c.log.LogAttrs(context.Background(), slog.LevelWarn, "consumer: count the workers of an ordered route",
				slog.String("queue", r.Queue), slog.Any("error", err))
			continue
		}
		for _, sh := range surplus(shards, workers) {
			s.c.log.LogAttrs(context.Background(), slog.LevelInfo, "consumer: handing over a shard",
				slog.String("queue", sh.queue), slog.Int("workers", workers))
			select {
			case sh.handover <- struct{}{}:
			default:
			}
		}
	}
}

// surplus returns the shards to give up: those this worker is active on
// beyond ceil(len(shards)/workers).
func surplus(shards []*shardSub, workers int) []*shardSub {
	if workers <= 1 {
		return nil
	}
	fair := (len(shards) + workers - 1) / workers
	var held []*shardSub
	for _, sh := range shards {
		if sh.active.Load() {
			held = append(held, sh)
		}
	}
	if len(held) <= fair {
		return nil
	}
	return held[fair:]
}

// countMembers returns the number of workers consuming route r (the
// members queue's consumer count).
func (s *session) countMembers(r *route) (int, error) {
	ch, err := s.conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("consumer: open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(membersQueueName(r.Queue), true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("consumer: inspect %q: %w", membersQueueName(r.Queue), err)
	}
	return q.Consumers, nil
}
