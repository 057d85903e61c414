package consumer_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// sequence records, per delivery, the statuses reported through
// OnTransition (with the key each one saw) and then "outcome <status>"
// from OnOutcome.
type sequence struct {
	inboxtype.NopObserver
	mu   sync.Mutex
	seen map[*inboxtype.Delivery][]inboxtype.Status
	keys map[*inboxtype.Delivery]string // the key when received was reported
	done chan *inboxtype.Delivery
}

func (s *sequence) OnTransition(d *inboxtype.Delivery, status inboxtype.Status, _ error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen[d] = append(s.seen[d], status)
	if status == inboxtype.StatusReceived {
		s.keys[d] = d.Key
	}
}

func (s *sequence) OnOutcome(d *inboxtype.Delivery, o inboxtype.Outcome) {
	s.mu.Lock()
	s.seen[d] = append(s.seen[d], "outcome "+o.Status())
	s.mu.Unlock()
	s.done <- d
}

// Every delivery is reported received exactly once, first, with its key
// when it could be decoded; its last transition is the settlement status
// that Outcome.Status names.
func TestObserver_ReceivedOnceAndSettlementMatchesTheOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seq := &sequence{seen: map[*inboxtype.Delivery][]inboxtype.Status{}, keys: map[*inboxtype.Delivery]string{}, done: make(chan *inboxtype.Delivery, 16)}
	r := consumer.NewRouter()
	consumer.Register(r, b.queue, inboxtype.HandlerFunc[order](func(_ context.Context, m *inboxtype.Message[order]) error {
		switch m.Body.ID {
		case "dup":
			return retry.ErrDuplicate
		case "perm":
			return retry.Permanent(errors.New("card declined"))
		case "again":
			return errors.New("gateway down")
		}
		return nil
	}), fastOpts())
	b.start(t, r, func(c *consumer.Config) { c.Observers = []inboxtype.Observer{seq} })

	for _, body := range []string{`{"id":"ok"}`, `{"id":"dup"}`, `{"id":"perm"}`, `{"id":"again"}`, `{bad`} {
		b.publish(t, b.queue, body)
	}
	want := map[string][]inboxtype.Status{ // by body: the settlement of each delivery
		`{"id":"ok"}`:    {inboxtype.StatusCompleted},
		`{"id":"dup"}`:   {inboxtype.StatusDuplicate},
		`{"id":"perm"}`:  {inboxtype.StatusDeadLettered},
		`{"id":"again"}`: {inboxtype.StatusRetry, inboxtype.StatusRetry, inboxtype.StatusDeadLettered}, // exhausted at 3
		`{bad`:           {inboxtype.StatusDeadLettered},
	}
	got := map[string][]inboxtype.Status{}
	for range 7 {
		d := testenv.WaitChan(t, seq.done, "a settled delivery")
		seq.mu.Lock()
		statuses, key := seq.seen[d], seq.keys[d]
		seq.mu.Unlock()
		require.GreaterOrEqual(t, len(statuses), 3, "%s: %v", d.Body, statuses)
		require.Equal(t, inboxtype.StatusReceived, statuses[0], "%s is received first: %v", d.Body, statuses)
		received := 0
		for _, s := range statuses {
			if s == inboxtype.StatusReceived {
				received++
			}
		}
		require.Equal(t, 1, received, "%s is received once: %v", d.Body, statuses)
		last, outcome := statuses[len(statuses)-2], statuses[len(statuses)-1]
		require.Equal(t, "outcome "+last, outcome, "%s: the settlement transition is the outcome's status", d.Body)
		require.Equal(t, d.Key, key, "%s: the received transition carries the key", d.Body)
		if string(d.Body) == `{bad` {
			require.Empty(t, key, "an undecodable delivery has no key")
		} else {
			require.NotEmpty(t, key)
		}
		got[string(d.Body)] = append(got[string(d.Body)], last)
	}
	require.Equal(t, want, got)
}
