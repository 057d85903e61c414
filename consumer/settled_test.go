package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/consumer"
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
	consumer.Register(r, b.queue, consumer.HandlerFunc[order](func(context.Context, *consumer.Message[order]) error {
		if calls.Add(1) < 3 {
			return errors.New("serialization failure")
		}
		return retry.Permanent(errors.New("card declined"))
	}), opts)
	c := b.start(t, r, nil)
	b.publish(t, b.queue, `{"id":"once"}`)

	o := b.rec.next(t)
	require.Equal(t, consumer.ActionDeadLettered, o.Outcome.Action)
	require.Equal(t, retry.ReasonPermanent, o.Outcome.Decision.Reason)
	require.Equal(t, 2, o.Outcome.InProcessRetries)
	b.stop(t, c)
	require.Equal(t, int32(3), calls.Load())
	require.Equal(t, int32(3), ruled.Load(), "one classification per handler result")
}
