package inboxtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/workerkit"
	"github.com/inboxmq/inboxmq/retry"
)

// ErrLockLost is the cause with which the lock-loss scenario cancels the
// first copy's context, as the lock middleware does when its lock expires.
var ErrLockLost = errors.New("inboxtest: lock lost mid-handler")

// Scenario names, in the order [Check] runs them.
const (
	SequentialDuplicates = "sequential duplicates"
	ConcurrentDuplicates = "concurrent duplicates"
	CrashBeforeCommit    = "crash before commit"
	CrashBeforeAck       = "crash between commit and ack"
	LockLoss             = "lock loss mid-handler"
	RedisFlush           = "redis flush between copies"
)

// Scenarios are every scenario name, in the order Check runs them.
var Scenarios = []string{SequentialDuplicates, ConcurrentDuplicates, CrashBeforeCommit, CrashBeforeAck, LockLoss, RedisFlush}

// Subject is the handler under test and how to observe its effects.
type Subject struct {
	// Worker holds the handler: a worker built with inboxmq.NewWorker,
	// with the Config it runs with (its Redis for the completed-cache and
	// the lock), and not started. Required.
	Worker *inboxmq.Worker
	// Queue is the queue of the worker's route under test. Nothing is sent
	// to a broker: deliveries are built in memory and handed to the
	// route's complete chain, the worker's own middleware included.
	// Required.
	Queue string
	// Message returns the body of a fresh, valid job: each call must return
	// a job with a new business identity (and so a new idempotency key),
	// because every scenario starts from nothing. Required.
	Message func(n int) []byte
	// Effects counts the committed effects of the job whose idempotency key
	// is key (for a payment, the ledger entries of its order), read from
	// the source of truth. Required.
	Effects func(ctx context.Context, key string) (int, error)
	// Faults is the fault injector installed on the pool of the handler's
	// inbox store. Defaults to nil, in which case the crash-before-commit
	// and lock-loss scenarios cannot run and are reported as not run.
	Faults *Faults
	// FlushRedis deletes the handler's Redis state (its lock and
	// completed-cache keys; see [FlushPrefix]). Defaults to nil: the flush
	// scenario then flushes nothing (and still checks the copy).
	FlushRedis func(ctx context.Context) error
	// Copies is the number of copies delivered in the duplicate scenarios.
	// Defaults to 3.
	Copies int
	// Timeout bounds each scenario. Defaults to 30s.
	Timeout time.Duration
}

// Result is the outcome of one scenario.
type Result struct {
	// Scenario is one of the scenario names.
	Scenario string
	// Key is the idempotency key of the scenario's job.
	Key string
	// Effects is the effect count at the end (it must be 1).
	Effects int
	// Outcomes lists the decision's kind for each delivery of the
	// scenario, in order ("succeeded", "duplicate", "retry", …): what the
	// consumer would decide (with the route's Rules).
	Outcomes []string
	// NotRun says why the scenario could not run (no Faults); empty if it
	// ran.
	NotRun string
	// Failures are the broken guarantees; empty means pass.
	Failures []string
}

// OK reports whether the scenario ran and passed (or could not run).
func (r *Result) OK() bool { return len(r.Failures) == 0 }

func (r *Result) fail(format string, args ...any) {
	r.Failures = append(r.Failures, fmt.Sprintf(format, args...))
}

// Run runs every scenario against s and fails tb for each broken guarantee:
// an effect that happened twice, or never. Scenarios that cannot run (no
// Faults) are logged.
func Run(tb testing.TB, s Subject) {
	tb.Helper()
	results, err := Check(context.Background(), s)
	if err != nil {
		tb.Fatalf("inboxtest: %v", err)
		return
	}
	for _, r := range results {
		switch {
		case r.NotRun != "":
			tb.Logf("inboxtest: %s: not run: %s", r.Scenario, r.NotRun)
		case !r.OK():
			for _, f := range r.Failures {
				tb.Errorf("inboxtest: %s (key %q, outcomes %v): %s", r.Scenario, r.Key, r.Outcomes, f)
			}
		}
	}
}

// Check runs every scenario against s and returns their results. It
// returns an error only when s is unusable (a required field missing, the
// queue not registered).
func Check(ctx context.Context, s Subject) ([]*Result, error) {
	h, err := newHarness(s)
	if err != nil {
		return nil, err
	}
	if err := workerkit.Prepare(ctx, s.Worker); err != nil {
		return nil, fmt.Errorf("the worker's inbox: %w", err)
	}
	var out []*Result
	for _, name := range Scenarios {
		out = append(out, h.run(ctx, name))
	}
	return out, nil
}

// FlushPrefix returns a Subject.FlushRedis that deletes every key starting
// with prefix (SCAN + DEL; never FLUSHDB) through del and scan, such as a
// go-redis client's methods adapted by the caller. See the package example.
func FlushPrefix(scan func(ctx context.Context, pattern string) ([]string, error), del func(ctx context.Context, keys ...string) error, prefix string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		if prefix == "" {
			return errors.New("inboxtest: FlushPrefix needs a prefix")
		}
		keys, err := scan(ctx, prefix+"*")
		if err != nil || len(keys) == 0 {
			return err
		}
		return del(ctx, keys...)
	}
}

type harness struct {
	s     Subject
	route consumer.Route
	run0  string
}

func newHarness(s Subject) (*harness, error) {
	if s.Worker == nil || s.Queue == "" || s.Message == nil || s.Effects == nil {
		return nil, errors.New("Subject needs Worker, Queue, Message and Effects")
	}
	if s.Copies <= 1 {
		s.Copies = 3
	}
	if s.Timeout <= 0 {
		s.Timeout = 30 * time.Second
	}
	r, err := workerkit.Route(s.Worker, s.Queue)
	if err != nil {
		return nil, err
	}
	return &harness{s: s, run0: randomHex(4), route: r}, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// copyOf is one message as the broker would hold it: a body and a message
// id that every redelivery of this copy keeps.
type copyOf struct {
	body []byte
	id   string
}

func (h *harness) newCopy(body []byte) copyOf {
	return copyOf{body: body, id: "inboxtest-" + randomHex(6)}
}

// deliverOnce hands one delivery of c to the route's chain, decides as
// the consumer would (consumer.Decide, with the route's rules) and
// settles the delivery with that decision, so the route's middleware
// (spans, metrics) sees it settled as under a consumer. Panics are caught
// and reported as errors: the kit calls the chain without a consumer, so
// this recover stands in for the consumer's last guard (permanent, so a
// panicking handler under test fails at once).
func (h *harness) deliverOnce(ctx context.Context, c copyOf, attempt int, redelivered bool) (d *inboxtype.Delivery, dec retry.Decision) {
	raw := &amqp.Delivery{
		MessageId:   c.id,
		Body:        c.body,
		ContentType: "application/json",
		RoutingKey:  h.s.Queue,
		Redelivered: redelivered,
		Headers:     amqp.Table{inboxtype.HeaderAttempt: int32(attempt)},
	}
	d = inboxtype.NewDelivery(h.s.Queue, h.route.Opts.Namespace, "inboxtest", raw)
	var err error
	func() {
		defer func() {
			if p := recover(); p != nil {
				err = retry.Permanent(fmt.Errorf("inboxtest: handler panicked: %v", p))
			}
		}()
		err = h.route.Handler(ctx, d)
	}()
	dec = consumer.Decide(ctx, err, h.route.Opts.Rules...)
	d.Settle(inboxtype.Outcome{Decision: dec, Action: actionOf(dec), Delay: dec.Delay, Duration: time.Since(d.ReceivedAt)})
	return d, dec
}

// actionOf is what the harness does with a delivery decided as dec, in
// the consumer's terms (it has no broker: a retry is delivered again at
// once, a dead letter fails the scenario).
func actionOf(dec retry.Decision) inboxtype.Action {
	switch dec.Kind {
	case retry.KindSucceeded, retry.KindDuplicate:
		return inboxtype.ActionAcked
	case retry.KindRetry:
		return inboxtype.ActionRetried
	case retry.KindPermanent:
		return inboxtype.ActionDeadLettered
	default:
		return inboxtype.ActionRequeued
	}
}

// settle delivers c until the consumer would ack it for good (succeeded or
// duplicate), as the broker would: a retry comes back with attempt+1, an
// interrupted or failed-by-crash delivery comes back redelivered. The first
// delivery uses first (a tagged or cancellable context) and later ones ctx.
// It returns the key and every outcome.
func (h *harness) settle(ctx, first context.Context, c copyOf, redelivered bool) (key string, outcomes []string, final retry.Kind, err error) {
	attempt := 1
	dctx := first
	for i := 0; ; i++ {
		d, dec := h.deliverOnce(dctx, c, attempt, redelivered)
		dctx = ctx
		if d.Key != "" {
			key = d.Key
		}
		outcomes = append(outcomes, dec.Kind.String())
		switch dec.Kind {
		case retry.KindSucceeded, retry.KindDuplicate:
			return key, outcomes, dec.Kind, nil
		case retry.KindPermanent:
			return key, outcomes, dec.Kind, fmt.Errorf("a valid job was dead-lettered: %w", dec.Err)
		case retry.KindRetry:
			if !dec.Uncounted { // a deferred retry keeps its attempt
				attempt++
			}
		case retry.KindInterrupted:
			redelivered = true
		}
		if ctx.Err() != nil {
			return key, outcomes, dec.Kind, fmt.Errorf("not settled before the scenario's timeout (last error: %w)", dec.Err)
		}
		// The broker would wait for the delay; a short pause is enough here,
		// as correctness never depends on timing.
		t := time.NewTimer(time.Duration(min(i+1, 10)) * 10 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

func (h *harness) effects(ctx context.Context, r *Result) {
	if r.Key == "" {
		r.fail("the handler never decoded the job (no idempotency key)")
		return
	}
	n, err := h.s.Effects(ctx, r.Key)
	if err != nil {
		r.fail("counting effects: %v", err)
		return
	}
	r.Effects = n
	switch {
	case n > 1:
		r.fail("effect happened %d times", n)
	case n == 0:
		r.fail("effect never happened")
	}
}

// jobs numbers the jobs given to Subject.Message: unique within the
// process, from a random start so that runs sharing a database do not
// collide.
var jobs atomic.Int64

func init() {
	var b [4]byte
	_, _ = rand.Read(b[:])
	jobs.Store(int64(b[0])<<16 | int64(b[1])<<8 | int64(b[2]))
}

func nextJob() int { return int(jobs.Add(1)) }

func (h *harness) run(parent context.Context, name string) *Result {
	r := &Result{Scenario: name}
	ctx, cancel := context.WithTimeout(parent, h.s.Timeout)
	defer cancel()
	body := h.s.Message(nextJob())
	record := func(key string, outcomes []string, err error) {
		if key != "" {
			r.Key = key
		}
		r.Outcomes = append(r.Outcomes, outcomes...)
		if err != nil {
			r.fail("%v", err)
		}
	}
	record3 := func(key string, outcomes []string, _ retry.Kind, err error) { record(key, outcomes, err) }
	switch name {
	case SequentialDuplicates:
		for i := range h.s.Copies {
			key, out, kind, err := h.settle(ctx, ctx, h.newCopy(body), false)
			record(key, out, err)
			if i > 0 && kind == retry.KindSucceeded {
				h.effects(ctx, r)
				if r.Effects > 1 {
					return r
				}
			}
		}
	case ConcurrentDuplicates:
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range h.s.Copies {
			wg.Go(func() {
				<-start
				key, out, _, err := h.settle(ctx, ctx, h.newCopy(body), false)
				mu.Lock()
				record(key, out, err)
				mu.Unlock()
			})
		}
		close(start)
		wg.Wait()
	case CrashBeforeCommit:
		if h.s.Faults == nil {
			r.NotRun = "Subject.Faults is nil"
			return r
		}
		return h.crashBeforeCommit(ctx, name)
	case CrashBeforeAck:
		c := h.newCopy(body)
		record3(h.settle(ctx, ctx, c, false))
		// The worker died after COMMIT, before the ack: the broker delivers
		// the very same message again, flagged as redelivered.
		key, out, kind, err := h.settle(ctx, ctx, c, true)
		record(key, out, err)
		if err == nil && kind != retry.KindDuplicate {
			r.fail("the redelivered copy was %s, want duplicate", kind)
		}
	case LockLoss:
		if h.s.Faults == nil {
			r.NotRun = "Subject.Faults is nil"
			return r
		}
		h.lockLoss(ctx, body, r, record)
	case RedisFlush:
		record3(h.settle(ctx, ctx, h.newCopy(body), false))
		if h.s.FlushRedis != nil {
			if err := h.s.FlushRedis(ctx); err != nil {
				r.fail("FlushRedis: %v", err)
			}
		}
		key, out, kind, err := h.settle(ctx, ctx, h.newCopy(body), false)
		record(key, out, err)
		if err == nil && kind != retry.KindDuplicate {
			r.fail("the copy after the flush was %s, want duplicate", kind)
		}
	}
	h.effects(ctx, r)
	return r
}

// maxCommitPoints bounds the commit points the crash scenario tries.
const maxCommitPoints = 6

// crashBeforeCommit fails the k-th COMMIT of a fresh job's first delivery,
// for k = 1, 2, … until a delivery makes fewer than k commits: every point
// at which a worker can die after writing and before committing. The
// delivery is then redelivered until it settles; its effect must be single.
func (h *harness) crashBeforeCommit(ctx context.Context, name string) *Result {
	r := &Result{Scenario: name}
	fired := 0
	for k := 1; k <= maxCommitPoints; k++ {
		body := h.s.Message(nextJob())
		tagged, rule := h.s.Faults.arm(ctx, k, actionFail)
		key, out, _, err := h.settle(ctx, tagged, h.newCopy(body), false)
		h.s.Faults.disarm(tagged)
		sub := &Result{Key: key}
		r.Outcomes = append(r.Outcomes, fmt.Sprintf("commit#%d:%s", k, strings.Join(out, ",")))
		if err != nil {
			r.fail("commit point %d: %v", k, err)
		}
		h.effects(ctx, sub)
		r.Key, r.Effects = key, sub.Effects
		for _, f := range sub.Failures {
			r.fail("commit point %d: %s", k, f)
		}
		if !rule.hasFired() {
			break
		}
		fired++
		// A second copy of the same job must find it done.
		_, out2, kind, err := h.settle(ctx, ctx, h.newCopy(body), false)
		r.Outcomes = append(r.Outcomes, "copy:"+strings.Join(out2, ","))
		if err == nil && kind != retry.KindDuplicate {
			r.fail("commit point %d: a later copy was %s, want duplicate", k, kind)
		}
	}
	if fired == 0 {
		r.fail("no COMMIT was made under the delivery's context: the handler does not commit through the instrumented pool (is it behind the inbox, and is the inbox store's pool instrumented with Faults.Instrument?)")
	}
	return r
}

// lockLoss pauses copy A at its first COMMIT (its writes made), lets copy B
// run, then cancels A's context with ErrLockLost as the lock middleware
// would, and releases A. Both copies are settled; the effect must be single.
func (h *harness) lockLoss(ctx context.Context, body []byte, r *Result, record func(string, []string, error)) {
	actx, cancelA := context.WithCancelCause(ctx)
	defer cancelA(nil)
	tagged, rule := h.s.Faults.arm(actx, 1, actionPause)
	defer h.s.Faults.disarm(tagged)

	type res struct {
		key string
		out []string
		err error
	}
	aDone := make(chan res, 1)
	a := h.newCopy(body)
	go func() {
		key, out, _, err := h.settle(ctx, tagged, a, false)
		aDone <- res{key, out, err}
	}()
	select {
	case <-rule.fired:
	case ra := <-aDone:
		record(ra.key, ra.out, ra.err)
		r.fail("copy A settled without reaching a COMMIT under its context (is it behind the inbox, and is the inbox store's pool instrumented with Faults.Instrument?)")
		return
	case <-ctx.Done():
		r.fail("copy A never reached its COMMIT")
		return
	}
	// The lock is gone: its keys vanish and another worker takes copy B.
	if h.s.FlushRedis != nil {
		if err := h.s.FlushRedis(ctx); err != nil {
			r.fail("FlushRedis: %v", err)
		}
	}
	bctx, bRule := h.s.Faults.arm(ctx, 0, actionFail) // nth 0: only watches
	defer h.s.Faults.disarm(bctx)
	bDone := make(chan res, 1)
	go func() {
		key, out, _, err := h.settle(ctx, bctx, h.newCopy(body), false)
		bDone <- res{key, out, err}
	}()
	// Let B reach the database (where it waits for A's row) before A loses
	// its lock; B may also settle at once (a cache hit or a held lock).
	t := time.NewTimer(2 * time.Second)
	select {
	case <-bRule.started:
	case <-t.C:
	}
	t.Stop()
	cancelA(ErrLockLost)
	h.s.Faults.disarm(tagged)
	ra := <-aDone
	rb := <-bDone
	record(ra.key, append([]string{"A:"}, ra.out...), ra.err)
	record(rb.key, append([]string{"B:"}, rb.out...), rb.err)
}
