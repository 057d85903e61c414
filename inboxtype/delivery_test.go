package inboxtype_test

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
)

type recorder struct {
	inboxtype.NopObserver
	seen []inboxtype.Status
}

func (r *recorder) OnTransition(_ *inboxtype.Delivery, s inboxtype.Status, _ error) {
	r.seen = append(r.seen, s)
}

// StatusReceived reaches the observers once per delivery, however often
// it is reported; every other status each time.
func TestDelivery_TransitionReportsReceivedOnce(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	d := inboxtype.NewDelivery("q", "ns", "w", &amqp.Delivery{Headers: amqp.Table{inboxtype.HeaderAttempt: int32(3)}}, rec)
	require.Equal(t, 3, d.Attempt)
	d.Transition(inboxtype.StatusReceived, nil)
	d.Transition(inboxtype.StatusProcessing, nil)
	d.Transition(inboxtype.StatusReceived, nil)
	d.Transition(inboxtype.StatusProcessing, nil)
	require.Equal(t, []inboxtype.Status{inboxtype.StatusReceived, inboxtype.StatusProcessing, inboxtype.StatusProcessing}, rec.seen)
}
