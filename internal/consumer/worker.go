package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/clip"
	"github.com/inboxmq/inboxmq/internal/envelope"
	"github.com/inboxmq/inboxmq/retry"
)

// errChannelGone: the delivery's channel closed before it could be settled;
// the broker redelivers it.
var errChannelGone = errors.New("consumer: channel closed before settlement; the broker redelivers")

// job is one delivery handed from a delivery loop to a worker. It carries
// its session and its channel's acker, so a worker settles on the channel
// (and publishes on the connection) the delivery came from, never on a
// newer one.
type job struct {
	raw  amqp.Delivery
	sess *session
	acks *acker
	// shard is the shard an ordered route's delivery came from (nil on
	// other routes); key is its ordering key.
	shard *shardSub
	key   string
	// fair is the share of a fair route's delivery (its key is its
	// tenant); nil on other routes.
	fair *fairShare
	// dead: the delivery came from the route's dead queue (see file).
	dead bool
}

// orderingKey is the ordering key the message was published with: its
// routing key, or for a message the broker dead-lettered into the dead
// queue, the routing key it had before.
func (j *job) orderingKey() string {
	if j.dead {
		return lastDeath(j.raw.Headers).routingKey
	}
	return orderingKey(&j.raw)
}

// finish tells an ordered delivery's shard that the delivery was settled
// with action (or will be redelivered): a handover waits for all of them.
// A settlement that is not final (requeued, abandoned) resets the shard's
// subscription first, before the caller releases the key's lane, so that
// nothing the shard delivered after it runs before its redelivery (see
// shardSub.reset).
func (j *job) finish(action inboxtype.Action) {
	if j.shard == nil {
		return
	}
	switch {
	case j.fair != nil:
		j.fair.done(j.key) // no order to keep: no reset
	case !settledForGood(action):
		j.shard.requestReset()
	}
	j.shard.inflight.Done()
}

// settledForGood reports whether a delivery settled with action is gone
// from its queue for good (acked, or acked after its dead letter was
// confirmed), so that the key's next delivery may run.
func settledForGood(action inboxtype.Action) bool {
	return action == inboxtype.ActionAcked || action == inboxtype.ActionDeadLettered
}

// ack acks the delivery through its channel's acker (coalesced with other
// acks where it can be).
func (j *job) ack() error { return j.settle(opAck) }

// requeue nacks the delivery with requeue=true.
func (j *job) requeue() error { return j.settle(opRequeue) }

func (j *job) settle(op ackOp) error { return j.acks.settle(j.raw.DeliveryTag, op) }

// consumeLoop feeds route r's workers from one channel of one session. It
// pauses and resumes with the route and ends with the session or on Stop.
func (s *session) consumeLoop(r *route, ch *amqp.Channel, tag string, deliveries <-chan amqp.Delivery) {
	defer s.loops.Done()
	acks := newAcker(ch, &s.c.acks)
	if h := s.c.hooks.Load(); h != nil {
		acks.beforeRound = h.beforeAckRound
	}
	for {
		if deliveries == nil {
			if !s.waitResumed(r) {
				return
			}
			tag = s.c.consumerTag(r.Queue)
			var err error
			deliveries, err = ch.Consume(r.Queue, tag, false, false, false, false, s.c.consumeArgs(r, s.timeouts))
			if err != nil {
				s.fail(fmt.Errorf("consumer: consume %q: %w", r.Queue, err))
				return
			}
		}
		if !s.pump(r, ch, acks, tag, deliveries) {
			return
		}
		deliveries = nil
	}
}

func (s *session) waitResumed(r *route) bool {
	for {
		paused, changed := r.pauseState()
		if !paused {
			return true
		}
		select {
		case <-changed:
		case <-s.stopConsuming:
			return false
		case <-s.failed:
			return false
		}
	}
}

// pump hands deliveries to the workers. It returns true when the route was
// paused (the broker consumer is cancelled and drained) and false when the
// loop must end (Stop, or the session failed).
func (s *session) pump(r *route, ch *amqp.Channel, acks *acker, tag string, deliveries <-chan amqp.Delivery) bool {
	for {
		paused, changed := r.pauseState()
		if paused {
			s.cancel(ch, acks, tag, deliveries, nil)
			return true
		}
		select { // Stop wins over a ready delivery
		case <-s.stopConsuming:
			s.cancel(ch, acks, tag, deliveries, nil)
			return false
		default:
		}
		select {
		case raw, ok := <-deliveries:
			if !ok {
				s.fail(fmt.Errorf("consumer: deliveries of %q ended (channel closed or consumer cancelled)", r.Queue))
				return false
			}
			// Tracked before any worker can settle it: the acker's
			// multiple=true acks rely on knowing every tag handed out.
			acks.track(raw.DeliveryTag)
			select {
			case r.jobs <- job{raw: raw, sess: s, acks: acks}:
			case <-changed:
				_ = acks.nack(raw.DeliveryTag, true)
			case <-s.stopConsuming:
				s.cancel(ch, acks, tag, deliveries, &raw)
				return false
			case <-s.failed:
				return false
			}
		case <-changed:
		case <-s.stopConsuming:
			s.cancel(ch, acks, tag, deliveries, nil)
			return false
		case <-s.failed:
			return false
		}
	}
}

// cancel cancels the broker consumer and requeues what it had prefetched
// (held included) but no worker started.
func (s *session) cancel(ch *amqp.Channel, acks *acker, tag string, deliveries <-chan amqp.Delivery, held *amqp.Delivery) {
	if held != nil {
		_ = acks.nack(held.DeliveryTag, true)
	}
	if err := ch.Cancel(tag, false); err != nil {
		return // the channel is gone: the broker requeues everything
	}
	for raw := range deliveries {
		acks.track(raw.DeliveryTag)
		_ = acks.nack(raw.DeliveryTag, true)
	}
}

// work is one worker of route r's fixed pool.
func (c *Consumer) work(r *route) {
	defer c.workers.Done()
	for {
		select {
		case j := <-r.jobs:
			// Take the slot only with a job in hand, so that idle workers
			// hold none and a lowered limit applies at once.
			if !r.sem.acquire(c.workersQuit) {
				_ = j.requeue()
				j.finish(inboxtype.ActionRequeued)
				c.runLane(r, &j, inboxtype.ActionRequeued)
				return
			}
			if j.sess.gone() {
				// Its channel died while the job waited for a slot: the
				// broker has redelivered it to the new session already.
				j.finish(inboxtype.ActionAbandoned)
				c.runLane(r, &j, inboxtype.ActionAbandoned)
				r.sem.release()
				continue
			}
			c.progress.begin()
			action := c.process(r, &j)
			c.progress.end()
			j.finish(action)
			c.runLane(r, &j, action)
			r.sem.release()
		case <-c.workersQuit:
			return
		}
	}
}

// process runs one delivery through the handler chain, settles it and
// returns the action that settled it.
func (c *Consumer) process(r *route, j *job) inboxtype.Action {
	opts := &r.Opts
	d := inboxtype.NewDelivery(r.Queue, opts.Namespace, c.cfg.Name, &j.raw, c.cfg.Observers...)
	settled := d.Own() // this consumer settles d and runs its hooks
	if !c.holdBack(r, j, d) {
		// Stop, or the end of the delivery's session, cut the wait short:
		// the handler did not run; it is requeued (or redelivered).
		d.Transition(inboxtype.StatusReceived, nil) // keeps received and settled lines paired
		return c.settle(r, j, d, settled, retry.Decision{Kind: retry.KindInterrupted, Reason: "stopped"}, runs{})
	}
	ctx := c.baseCtx
	rn := runs{tries: 1}
	err := c.call(ctx, r.Handler, d, &rn.last)
	d.Transition(inboxtype.StatusReceived, nil) // the decode adapter did unless decoding failed
	// Each handler result is classified once, with the route's rules; the
	// in-process check, the in-process loop and the settlement decision
	// all read that classification.
	cls := retry.Classify(err, opts.Rules...)
	if err != nil && opts.Ordered != nil {
		// An ordered route retries in process only: the key's later
		// deliveries wait behind this one.
		dec, stopped := c.retryOrdered(ctx, r, j, d, settled, err, cls, &rn)
		if stopped {
			dec = retry.Decision{Kind: retry.KindInterrupted, Reason: "stopped", Err: dec.Err}
		}
		return c.settle(r, j, d, settled, dec, rn)
	}
	if err != nil && inProcessTries(opts.InProcess) > 0 && cls.Kind == retry.KindRetry && cls.Delay == 0 && ctx.Err() == nil {
		// A blip: retry in process. The fast path above keeps the
		// backoff machinery off the path of deliveries that succeed;
		// Do's first "call" replays the error we already have.
		cls, err = c.retryInProcess(ctx, r, d, settled, err, cls, &rn)
	}
	return c.settle(r, j, d, settled, decide(ctx, err, cls), rn)
}

// runs counts a delivery's runs of its handler chain: the tries so far,
// and how long the last one took.
type runs struct {
	tries int
	last  time.Duration
}

// inProcess is the number of in-process tries after the first.
func (rn runs) inProcess() int { return max(rn.tries-1, 0) }

// holdBack makes a delivery whose settlement failed lately wait out its
// delay before its handler runs: it may be back at once, requeued after a
// wait that its session's end cut short, or redelivered on a new session
// after its copy broke the old one. Each failure in a row waits longer, so
// a delivery that can never be settled runs a few times a minute at most,
// not in a hot loop. It returns false if Stop or the end of the delivery's
// session cut the wait short.
func (c *Consumer) holdBack(r *route, j *job, d *inboxtype.Delivery) bool {
	wait, fails := c.settleFailures.hold(r.Queue, &j.raw, time.Now())
	if wait <= 0 {
		return true
	}
	c.log.LogAttrs(context.Background(), slog.LevelWarn, "consumer: holding back a delivery whose settlement failed before",
		slog.String("queue", r.Queue), slog.String("message_id", d.MessageID),
		slog.Int("settlement_failures", fails), slog.Duration("wait", wait))
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.stopCh:
		return false
	case <-j.sess.failed:
		return false
	}
}

// retryInProcess runs opts.InProcess.Do after a first failed call (first,
// classified as firstCls), reporting OnInProcessRetry before each pause
// and settling each run that is retried (OnSettled hooks, with
// ActionRetriedInProcess) just before the next one. It returns the classification of the last result and the last error.
// Each result is classified once: Do reads that classification through
// the rule it is given instead of classifying the error again.
func (c *Consumer) retryInProcess(ctx context.Context, r *route, d *inboxtype.Delivery, settled func(inboxtype.Outcome), first error, firstCls retry.Decision, rn *runs) (retry.Decision, error) {
	opts := &r.Opts
	maxTries := inProcessTries(opts.InProcess)
	calls := 0
	cls := firstCls
	var delay time.Duration // the nominal pause before the next try
	err := opts.InProcess.Do(ctx, func(ctx context.Context) error {
		calls++
		err := first
		if calls > 1 {
			settled(inboxtype.Outcome{
				Decision: cls, Action: inboxtype.ActionRetriedInProcess, Delay: delay,
				Duration: time.Since(d.ReceivedAt), Handled: rn.last, InProcessRetries: rn.inProcess(),
			})
			rn.tries++
			err = c.call(ctx, r.Handler, d, &rn.last)
			cls = retry.Classify(err, opts.Rules...)
		}
		delay = 0
		if err != nil && calls <= maxTries && ctx.Err() == nil && cls.Kind == retry.KindRetry && cls.Delay == 0 {
			delay = nominalInProcessDelay(opts.InProcess, calls)
			for _, o := range c.cfg.Observers {
				o.OnInProcessRetry(d, cls, delay)
			}
		}
		return err
	}, func(error) (retry.Decision, bool) { return cls, true })
	if err == nil {
		return retry.Decision{Kind: retry.KindSucceeded}, nil
	}
	if ctx.Err() != nil {
		// Do joins the context's error to the last one: a new error.
		return retry.Classify(err, opts.Rules...), err
	}
	return cls, err
}

// call runs the handler under the one recover of a delivery's path (the
// last guard): a panic becomes an error with reason "panic" (an error
// value stays in its chain), retried under the route's policy and then
// dead-lettered, and the worker lives on. The stack is logged here, once,
// with the delivery's fields, in the line's stack attribute.
// Code that runs a handler on another goroutine (the inbox's group commit,
// a combining round) recovers there, since a panic there cannot reach this
// guard.
// took is set to the time the run took, a panicking one too.
func (c *Consumer) call(ctx context.Context, h inboxtype.DeliveryHandler, d *inboxtype.Delivery, took *time.Duration) (err error) {
	start := time.Now()
	defer func() {
		*took = time.Since(start)
		p := recover()
		if p == nil {
			return
		}
		c.log.LogAttrs(ctx, slog.LevelError, "consumer: handler panicked",
			slog.String("queue", d.Queue), slog.String("namespace", d.Namespace),
			slog.String("message_id", d.MessageID), slog.String("idempotency_key", d.Key),
			slog.String("panic", clip.Text(fmt.Sprint(p), clip.Limit)), slog.String("stack", string(debug.Stack())))
		if perr, ok := p.(error); ok {
			err = retry.WithReason(retry.ReasonPanic, fmt.Errorf("consumer: handler panicked: %w", perr))
			return
		}
		err = retry.WithReason(retry.ReasonPanic, fmt.Errorf("consumer: handler panicked: %v", p))
	}()
	return h(ctx, d)
}

// Decide returns the decision the consumer settles a handler result on:
// err classified by the route's rules (retry.Classify), adjusted for a
// stop. It is the one decision function; the consumer applies it to every
// delivery, and code that runs a route's chain outside a consumer (such as
// inboxtest) calls it to settle as the consumer would. The retry policy
// then decides, when the delivery is settled, whether a retry still has
// an attempt left (otherwise the Outcome's reason is exhausted).
//
// Work whose context was cancelled by Stop (cause [ErrStopped]) is
// interrupted (requeued, attempt not counted), unless it succeeded or was
// a duplicate: those are committed and must be acked.
//
// A handler's own retry.Interrupted outside a stop (a dependency dropped)
// becomes an uncounted broker retry through the shortest delay tier: an
// immediate requeue would redeliver it at once, in a hot loop, for as long
// as the dependency is down.
func Decide(ctx context.Context, err error, rules ...retry.Rule) retry.Decision {
	return decide(ctx, err, retry.Classify(err, rules...))
}

// decide is Decide for an error already classified as dec.
func decide(ctx context.Context, err error, dec retry.Decision) retry.Decision {
	stopping := errors.Is(context.Cause(ctx), ErrStopped)
	switch dec.Kind {
	case retry.KindSucceeded, retry.KindDuplicate:
		return dec
	case retry.KindInterrupted:
		if stopping {
			return dec
		}
		return retry.Decision{Kind: retry.KindRetry, Uncounted: true, Reason: dec.Reason, Err: err}
	}
	if stopping {
		return retry.Decision{Kind: retry.KindInterrupted, Reason: "stopped", Err: err}
	}
	return dec
}

// settle turns the decision into broker actions and reports the outcome:
// to the delivery's OnSettled hooks first, then to the observers. Nothing
// is acked before it is committed or durably re-published. It returns the
// action taken.
func (c *Consumer) settle(r *route, j *job, d *inboxtype.Delivery, settled func(inboxtype.Outcome), dec retry.Decision, rn runs) inboxtype.Action {
	out := inboxtype.Outcome{Decision: dec, InProcessRetries: rn.inProcess(), Handled: rn.last}
	var status inboxtype.Status
	began := j.sess.beginSettle()
	if began {
		defer j.sess.settling.Done()
	}
	switch {
	case !began || channelClosed(&j.raw):
		// Nothing can settle it: the broker has it back (or will, when
		// the failed session closes). No copy either, which would only be
		// a second one beside the redelivery.
		out.Action, out.Err, status = inboxtype.ActionAbandoned, errChannelGone, inboxtype.StatusFailed
	case dec.Kind == retry.KindSucceeded || dec.Kind == retry.KindDuplicate:
		if err := c.reply(r, j, d, dec); err != nil {
			status = c.requeueAfter(r, j, &out, err)
			break
		}
		c.hooks.Load().runBeforeAck(d)
		status = inboxtype.StatusCompleted
		if dec.Kind == retry.KindDuplicate {
			status = inboxtype.StatusDuplicate
		}
		out.Action = inboxtype.ActionAcked
		status = c.settled(r, j, &out, j.ack(), status)
	case dec.Kind == retry.KindRetry && r.Opts.Ordered != nil:
		// An ordered route retried in process (retryOrdered) until the
		// policy gave up: the last attempt is spent.
		out.Decision.Reason, out.Decision.Err = retry.ReasonExhausted, exhausted(d.Attempt, dec.Err)
		status = c.deadLetter(r, j, d, &out)
	case dec.Kind == retry.KindRetry:
		// A deferred retry (another worker holds the key) is not a failed
		// attempt: same attempt number, no policy bound.
		var delay time.Duration
		next := d.Attempt
		if !dec.Uncounted {
			var ok bool
			delay, ok = r.Opts.Policy.NextDelay(d.Attempt, dec.Err)
			if !ok {
				// Attempts count only the delivery's own failures:
				// deferrals, stops and redeliveries keep its number.
				out.Decision.Reason, out.Decision.Err = retry.ReasonExhausted, exhausted(d.Attempt, dec.Err)
				status = c.deadLetter(r, j, d, &out)
				break
			}
			next++
		}
		msg := envelope.Copy(&j.raw, func(h amqp.Table) {
			setFailureHeaders(h, d.CopyHeaders, r.Queue, dec.Reason, dec.Err, time.Now())
			h[inboxtype.HeaderAttempt] = int64(next)
		})
		wait, err := c.sendRetry(r, j, d, next, max(dec.Delay, delay), &msg)
		if err != nil {
			status = c.requeueAfter(r, j, &out, err)
			break
		}
		c.hooks.Load().runAfterPublish(d)
		r.copyFailures.Store(0)
		out.Action, out.Delay = inboxtype.ActionRetried, wait
		status = c.settled(r, j, &out, j.ack(), inboxtype.StatusRetry)
	case dec.Kind == retry.KindPermanent:
		status = c.deadLetter(r, j, d, &out)
	default: // interrupted
		out.Action = inboxtype.ActionRequeued
		status = c.settled(r, j, &out, j.requeue(), inboxtype.StatusRequeued)
	}
	out.Duration = time.Since(d.ReceivedAt)
	if out.Err != nil {
		c.log.LogAttrs(context.Background(), slog.LevelWarn, "consumer: settlement failed",
			slog.String("queue", r.Queue), slog.String("message_id", d.MessageID),
			slog.String("action", string(out.Action)), slog.Any("error", out.Err))
	}
	settled(out)
	statusErr := dec.Err
	if out.Err != nil {
		statusErr = out.Err
	}
	d.Transition(status, statusErr)
	for _, o := range c.cfg.Observers {
		o.OnOutcome(d, out)
	}
	return out.Action
}

// channelClosed reports whether raw's channel is closed already: the
// session notices a closed channel a moment later (its watcher), and a
// delivery settled in between would get a copy beside its redelivery.
func channelClosed(raw *amqp.Delivery) bool {
	ch, ok := raw.Acknowledger.(interface{ IsClosed() bool })
	return ok && ch.IsClosed()
}

// exhausted is the error of a delivery dead-lettered after n failed
// attempts of its own, the last with err: the x-error of its dead letter,
// its log line and its inbox row read "exhausted: after n failed
// attempts: err".
func exhausted(n int, err error) error {
	if err == nil {
		err = errors.New("unknown error")
	}
	return fmt.Errorf("after %d failed attempts: %w", n, err)
}

// sendRetry makes msg, the retry copy of d with attempt number attempt,
// come back to r's queue after delay, and returns the delay it will wait.
// With Config.ScheduleRetry it is scheduled there, exactly delay ahead,
// independent of the broker's dead-letter hop; if that fails (the database
// does not answer), and without it, the copy is published with confirm to
// the shortest delay queue that waits at least delay.
func (c *Consumer) sendRetry(r *route, j *job, d *inboxtype.Delivery, attempt int, delay time.Duration, msg *amqp.Publishing) (time.Duration, error) {
	if c.cfg.ScheduleRetry != nil {
		if delay <= 0 { // as the delay queues do: not back at once, in a loop
			delay = retry.Tier(r.Opts.Queue.RetryTiers, 0)
		}
		ctx, cancel := context.WithTimeout(c.baseCtx, c.cfg.PublishTimeout)
		err := c.cfg.ScheduleRetry(ctx, r.Queue, attempt, delay, msg)
		cancel()
		if err == nil {
			return delay, nil
		}
		c.log.LogAttrs(context.Background(), slog.LevelWarn, "consumer: retry not scheduled in the database; it waits in a delay queue",
			slog.String("queue", r.Queue), slog.String("message_id", d.MessageID), slog.Any("error", err))
	}
	tier := retry.Tier(r.Opts.Queue.RetryTiers, delay)
	return tier, j.sess.pub.publish(c.baseCtx, inboxtype.RetryQueue(r.Queue, tier), *msg)
}

// deadLetter publishes a copy to the DLQ with confirm, then acks.
func (c *Consumer) deadLetter(r *route, j *job, d *inboxtype.Delivery, out *inboxtype.Outcome) inboxtype.Status {
	msg := envelope.Copy(&j.raw, func(h amqp.Table) {
		setFailureHeaders(h, d.CopyHeaders, r.Queue, out.Decision.Reason, out.Decision.Err, time.Now())
		h[inboxtype.HeaderAttempt] = int64(d.Attempt)
		if d.Key != "" {
			h[inboxtype.HeaderIdempotencyKey] = d.Key
		}
		if r.Opts.Ordered != nil {
			h[headerOrderingKey] = j.orderingKey()
		}
	})
	if err := j.sess.pub.publish(c.baseCtx, r.Opts.Queue.DeadLetterQueue, msg); err != nil {
		return c.requeueAfter(r, j, out, err)
	}
	c.hooks.Load().runAfterPublish(d)
	r.copyFailures.Store(0)
	if err := r.runOnDeadLetter(c.baseCtx, d, out.Decision, msg.Headers); err != nil {
		return c.requeueAfter(r, j, out, err)
	}
	out.Action = inboxtype.ActionDeadLettered
	return c.settled(r, j, out, j.ack(), inboxtype.StatusDeadLettered)
}

// settled records the result of the final ack or nack: if it failed, the
// channel is gone, nothing was settled and the broker redelivers (after
// the delivery's hold: the failure is remembered). A delivery acked is
// done and forgotten.
func (c *Consumer) settled(r *route, j *job, out *inboxtype.Outcome, err error, status inboxtype.Status) inboxtype.Status {
	if err == nil {
		if out.Action != inboxtype.ActionRequeued {
			c.settleFailures.forget(r.Queue, &j.raw)
		}
		return status
	}
	c.settleFailures.record(identify(r.Queue, &j.raw), 0, time.Now())
	out.Action, out.Err = inboxtype.ActionAbandoned, err
	return inboxtype.StatusFailed
}

// requeueAfter handles a failed, unconfirmed or returned copy: the
// original is requeued, never acked. A returned copy means a queue of the
// route's topology is missing: it is declared again first, so the next try
// finds it.
func (c *Consumer) requeueAfter(r *route, j *job, out *inboxtype.Outcome, pubErr error) inboxtype.Status {
	if errors.Is(pubErr, errReturned) {
		if err := declareTopology(j.sess.conn, r.Route); err != nil {
			pubErr = errors.Join(pubErr, err)
		}
	}
	// The broker would redeliver at once: while copies keep failing (a
	// nacking or blocked broker, a DLQ without a quorum, a copy that breaks
	// the connection), wait first, longer each time, so the route does not
	// spin through handler runs. The failure is remembered: if Stop or the
	// session's end cuts the wait short, the delivery's return waits out
	// the rest (holdBack).
	fails := r.copyFailures.Add(1)
	wait := c.settleFailures.record(identify(r.Queue, &j.raw), int(fails), time.Now())
	t := time.NewTimer(wait)
	select {
	case <-t.C:
	case <-c.baseCtx.Done():
		t.Stop()
	case <-j.sess.failed:
		t.Stop()
	}
	out.Action = inboxtype.ActionRequeued
	if err := j.requeue(); err != nil {
		out.Action = inboxtype.ActionAbandoned
		pubErr = errors.Join(pubErr, err)
	}
	out.Err = pubErr
	if out.Action == inboxtype.ActionAbandoned {
		return inboxtype.StatusFailed
	}
	return inboxtype.StatusRequeued
}

// inProcessTries mirrors retry.InProcess's defaults: extra tries after the
// first call.
func inProcessTries(p retry.InProcess) int {
	switch {
	case p.Tries == 0:
		return 2
	case p.Tries < 0:
		return 0
	default:
		return p.Tries
	}
}

// nominalInProcessDelay is the un-jittered pause before extra try n (1-based)
// under backoff/v4's default multiplier of 1.5, for observers.
func nominalInProcessDelay(p retry.InProcess, n int) time.Duration {
	initial, maxI := p.InitialInterval, p.MaxInterval
	if initial <= 0 {
		initial = 20 * time.Millisecond
	}
	if maxI <= 0 {
		maxI = 200 * time.Millisecond
	}
	d := float64(initial)
	for i := 1; i < n; i++ {
		d *= 1.5
	}
	return min(time.Duration(d), maxI)
}
