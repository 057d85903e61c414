package consumer_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// The route's rules run once per handler result: the in-process check, the
// in-process loop and the settlement decision share one classification.
// Two blips retried in process and a permanent failure are three results.
func TestConsumer_ClassifiesEachHandlerResultOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls, ruled atomic.Int32
	opts := fastOpts()
	opts.InProcess = retry.InProcess{Tries: 2, InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond}
	opts.Rules = []retry.Rule{func(error) (retry.Decision, bool) {
		ruled.Add(1)
		return retry.Decision{}, false
	}}
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error {
		if calls.Add(1) < 3 {
			return errors.New("serialization failure")
		}
		return retry.Permanent(errors.New("card declined"))
	}), opts)
	c := b.start(t, r, nil)
	b.publish(t, b.queue, `{"id":"once"}`)

	o := b.rec.next(t)
	require.Equal(t, inboxtype.ActionDeadLettered, o.Outcome.Action)
	require.Equal(t, retry.ReasonPermanent, o.Outcome.Decision.Reason)
	require.Equal(t, 2, o.Outcome.InProcessRetries)
	b.stop(t, c)
	require.Equal(t, int32(3), calls.Load())
	require.Equal(t, int32(3), ruled.Load(), "one classification per handler result")
}

// settledHook is one run of an OnSettled hook.
type settledHook struct {
	name string
	out  inboxtype.Outcome
}

// hookLog collects the OnSettled hooks that ran, and, as the consumer's
// observer, how many had run when OnOutcome came.
type hookLog struct {
	inboxtype.NopObserver
	mu        sync.Mutex
	ran       []settledHook
	atOutcome chan int
}

func (l *hookLog) hook(name string) func(inboxtype.Outcome) {
	return func(o inboxtype.Outcome) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.ran = append(l.ran, settledHook{name: name, out: o})
	}
}

func (l *hookLog) snapshot() []settledHook {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ran)
}

func (l *hookLog) OnOutcome(*inboxtype.Delivery, inboxtype.Outcome) { l.atOutcome <- len(l.snapshot()) }

// registering returns middleware that registers hook name before calling
// next, then tries to settle the delivery itself (which a consumer's
// delivery ignores).
func (l *hookLog) registering(name string) inboxtype.Middleware {
	return func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
		return func(ctx context.Context, d *inboxtype.Delivery) error {
			d.OnSettled(l.hook(name))
			err := next(ctx, d)
			d.Settle(inboxtype.Outcome{Action: inboxtype.ActionAbandoned})
			return err
		}
	}
}

// Each run of the chain settles its hooks once: a run retried in process
// just before the next run, the last one with the outcome the observers
// get, innermost hook first, before the observers hear of it. Middleware
// cannot settle a consumer's delivery itself.
func TestConsumer_OnSettledRunsOncePerRunBeforeTheObservers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := &hookLog{atOutcome: make(chan int, 4)}
	var calls atomic.Int32
	opts := fastOpts()
	opts.InProcess = retry.InProcess{Tries: 2, InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond}
	opts.Middleware = []inboxtype.Middleware{l.registering("inner")}
	r := consumer.NewRouter()
	r.Use(l.registering("outer"))
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error {
		if calls.Add(1) == 1 {
			return retry.WithReason("blip", errors.New("serialization failure"))
		}
		return nil
	}), opts)
	c := b.start(t, r, func(cfg *consumer.Config) { cfg.Observers = append(cfg.Observers, l) })
	b.publish(t, b.queue, `{"id":"hooks"}`)

	o := b.rec.next(t)
	require.Equal(t, inboxtype.ActionAcked, o.Outcome.Action)
	require.Equal(t, 4, testenv.WaitChan(t, l.atOutcome, "OnOutcome"), "every hook ran before OnOutcome")
	b.stop(t, c)

	ran := l.snapshot()
	require.Len(t, ran, 4, "each hook once per run")
	require.Equal(t, []string{"inner", "outer", "inner", "outer"}, []string{ran[0].name, ran[1].name, ran[2].name, ran[3].name})
	for _, h := range ran[:2] {
		require.Equal(t, inboxtype.ActionRetriedInProcess, h.out.Action)
		require.Equal(t, inboxtype.StatusRetryInProcess, h.out.Status())
		require.Equal(t, retry.KindRetry, h.out.Decision.Kind)
		require.Equal(t, "blip", h.out.Decision.Reason)
		require.Equal(t, time.Millisecond, h.out.Delay, "the nominal pause before the next try")
		require.Equal(t, 0, h.out.InProcessRetries)
	}
	for _, h := range ran[2:] {
		require.Equal(t, o.Outcome.Action, h.out.Action, "the observers' outcome")
		require.Equal(t, o.Outcome.Decision.Kind, h.out.Decision.Kind)
		require.Equal(t, 1, h.out.InProcessRetries)
	}
}

// A last attempt's hooks see the delivery as settled: dead-lettered with
// reason exhausted, which no classification of the error says.
func TestConsumer_OnSettledSeesExhaustion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := &hookLog{atOutcome: make(chan int, 4)}
	opts := fastOpts()
	opts.Policy = retry.Exponential{InitialInterval: 50 * time.Millisecond, MaxAttempts: 1}
	r := consumer.NewRouter()
	r.Use(l.registering("only"))
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error {
		return errors.New("gateway timeout")
	}), opts)
	b.start(t, r, nil)
	b.publish(t, b.queue, `{"id":"exhausted"}`)

	require.Equal(t, inboxtype.ActionDeadLettered, b.rec.next(t).Outcome.Action)
	ran := l.snapshot()
	require.Len(t, ran, 1)
	require.Equal(t, inboxtype.ActionDeadLettered, ran[0].out.Action)
	require.Equal(t, retry.ReasonExhausted, ran[0].out.Decision.Reason)
}

// Outside a consumer, whoever handles the delivery settles it: Settle runs
// the hooks once, innermost first; a second Settle finds none.
func TestDelivery_SettleOutsideAConsumer(t *testing.T) {
	t.Parallel()
	l := &hookLog{}
	d := inboxtype.NewDelivery("q", "q", "w", &amqp.Delivery{})
	d.OnSettled(l.hook("outer"))
	d.OnSettled(l.hook("inner"))
	d.OnSettled(nil)
	want := inboxtype.Outcome{Decision: retry.Decision{Kind: retry.KindSucceeded}, Action: inboxtype.ActionAcked}
	d.Settle(want)
	d.Settle(inboxtype.Outcome{Action: inboxtype.ActionAbandoned})
	require.Equal(t, []settledHook{{"inner", want}, {"outer", want}}, l.snapshot())
}
