package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// gateway stands in for an outside service: it counts calls per key.
type gateway struct{ calls atomic.Int64 }

func (g *gateway) charge(context.Context, string) (any, error) {
	n := g.calls.Add(1)
	return map[string]any{"charge_id": "ch_" + string(rune('0'+n))}, nil
}

// completingClaimHandler is a claim handler that only completes, writing
// one effect row.
func completingClaimHandler(b *testBundle, gc *inbox.GroupCommit, opts *inbox.ClaimOpts) inboxtype.Handler[order] {
	return inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		return c.Complete(ctx, completeWithEffect(msg))
	}, gc, opts)
}

// completeWithEffect is a Complete callback writing one effect row.
func completeWithEffect(msg *inboxtype.Message[order]) func(ctx context.Context, tx pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (key, amount) VALUES ($1, $2)`, msg.Key, msg.Body.Amount)
		return err
	}
}

func TestClaim_TwoWorkersOneOutsideCallOneEffect(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	gw := &gateway{}
	entered := make(chan struct{})
	release := make(chan struct{})
	var first atomic.Bool
	h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		if first.CompareAndSwap(false, true) {
			close(entered)
			<-release
		}
		if _, err := c.Step(ctx, "charge", func(ctx context.Context) (any, error) { return gw.charge(ctx, c.Key) }); err != nil {
			return err
		}
		return c.Complete(ctx, completeWithEffect(msg))
	}, nil, nil)

	done := make(chan error, 1)
	firstMsg := newMsg(t, "payments", order{OrderID: "1", Amount: 10}, false)
	go func() { done <- h.Handle(t.Context(), firstMsg) }()
	testenv.WaitChan(t, entered, "first worker claimed")

	err := h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "1", Amount: 10}, false))
	d := retry.Classify(err)
	require.Equal(t, retry.KindRetry, d.Kind, "%v", err)
	require.Equal(t, inbox.ReasonClaimHeld, d.Reason)
	require.Positive(t, d.Delay)

	close(release)
	require.NoError(t, testenv.WaitChan(t, done, "first worker finished"))

	err = h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "1", Amount: 10}, false))
	require.ErrorIs(t, err, retry.ErrDuplicate)
	require.Equal(t, retry.SourceInbox, retry.Classify(err).Source)

	require.Equal(t, int64(1), gw.calls.Load())
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
	r := b.get(t, "payments", "order:1")
	require.Equal(t, inbox.RecordCompleted, r.Status)
	require.Nil(t, r.Owner)
	require.Equal(t, int64(1), r.Fence)
}

// A copy that meets another worker's live claim looks again after a
// second, then after twice what it last waited, never past the holder's
// remaining lease; what its headers say of earlier waits is bounded.
func TestClaim_HeldKeyDeferralGrowsUpToTheLease(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	entered, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		if first.CompareAndSwap(false, true) {
			close(entered)
			<-release
		}
		return c.Complete(ctx, completeWithEffect(msg))
	}, nil, &inbox.ClaimOpts{Lease: 20 * time.Second})
	done := make(chan error, 1)
	go func() { done <- h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "1", Amount: 10}, false)) }()
	testenv.WaitChan(t, entered, "the first worker holds the claim")

	ago := func(d time.Duration) string { return time.Now().Add(-d).UTC().Format(time.RFC3339Nano) }
	for _, tt := range []struct {
		name     string
		headers  amqp.Table
		min, max time.Duration
	}{
		{"first meeting", nil, time.Second, time.Second},
		{"deferred 3s ago for the held claim", amqp.Table{
			inboxtype.HeaderError: "claim_held: inbox: key is claimed", inboxtype.HeaderLastFailedAt: ago(3 * time.Second),
		}, 6 * time.Second, 7 * time.Second},
		{"waited longer than the lease", amqp.Table{
			inboxtype.HeaderError: "claim_held: inbox: key is claimed", inboxtype.HeaderLastFailedAt: ago(time.Hour),
		}, 15 * time.Second, 20 * time.Second},
		{"last retried for another reason", amqp.Table{
			inboxtype.HeaderError: "db_connection: gone", inboxtype.HeaderLastFailedAt: ago(8 * time.Second),
		}, time.Second, time.Second},
		{"a failure time in the future", amqp.Table{
			inboxtype.HeaderError: "claim_held: inbox: key is claimed", inboxtype.HeaderLastFailedAt: ago(-time.Hour),
		}, time.Second, time.Second},
		{"a failure time that does not parse", amqp.Table{
			inboxtype.HeaderError: "claim_held: inbox: key is claimed", inboxtype.HeaderLastFailedAt: "yesterday",
		}, time.Second, time.Second},
	} {
		msg := newMsg(t, "payments", order{OrderID: "1", Amount: 10}, false)
		msg.Delivery.Headers = tt.headers
		err := h.Handle(t.Context(), msg)
		d := retry.Classify(err)
		require.Equal(t, retry.KindRetry, d.Kind, "%s: %v", tt.name, err)
		require.Equal(t, inbox.ReasonClaimHeld, d.Reason, tt.name)
		require.True(t, d.Uncounted, "%s: a deferral is not an attempt", tt.name)
		require.GreaterOrEqual(t, d.Delay, tt.min, tt.name)
		require.LessOrEqual(t, d.Delay, tt.max, tt.name)
	}
	close(release)
	require.NoError(t, testenv.WaitChan(t, done, "the first worker completes"))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
}

func TestClaim_ExpiredLeaseFencesOutTheLateWorker(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	claimed := make(chan *inbox.Claim, 1)
	proceed := make(chan struct{})
	late := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		claimed <- c
		<-proceed
		return c.Complete(ctx, completeWithEffect(msg))
	}, nil, nil)
	lateErr := make(chan error, 1)
	lateMsg := newMsg(t, "payments", order{OrderID: "2", Amount: 1}, false)
	go func() { lateErr <- late.Handle(t.Context(), lateMsg) }()
	lateClaim := testenv.WaitChan(t, claimed, "late worker claimed")

	// Time passes: the late worker's lease runs out (it stalled in GC, lost
	// its network…). A second worker takes the claim over and completes.
	_, err := b.pool.Exec(t.Context(), `UPDATE inboxmq_inbox SET lease_until = now() - interval '1 second'`)
	require.NoError(t, err)
	var fence int64
	winner := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		fence = c.Fence
		return c.Complete(ctx, completeWithEffect(msg))
	}, nil, nil)
	require.NoError(t, winner.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "2", Amount: 1}, false)))
	require.Equal(t, lateClaim.Fence+1, fence)

	close(proceed)
	err = testenv.WaitChan(t, lateErr, "late worker finished")
	require.ErrorIs(t, err, retry.ErrDuplicate)
	require.Equal(t, retry.SourceFenced, retry.Classify(err).Source)

	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
	r := b.get(t, "payments", "order:2")
	require.Equal(t, inbox.RecordCompleted, r.Status)
	require.Equal(t, fence, r.Fence)
	require.Equal(t, 1, r.Attempts, "a takeover is not a broker attempt")
}

func TestClaim_HeartbeatExtendsUpToTheCap(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	obs := &transitions{}
	opts := &inbox.ClaimOpts{Lease: 300 * time.Millisecond, Heartbeat: 75 * time.Millisecond, MaxLease: 900 * time.Millisecond}
	var initial, final time.Time
	h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		q := `SELECT lease_until FROM inboxmq_inbox WHERE key = $1`
		if err := b.pool.QueryRow(ctx, q, c.Key).Scan(&initial); err != nil {
			return err
		}
		<-ctx.Done()
		if err := b.pool.QueryRow(t.Context(), q, c.Key).Scan(&final); err != nil {
			return err
		}
		return context.Cause(ctx)
	}, nil, opts)
	msg := newMsg(t, "payments", order{OrderID: "hb"}, false)
	msg.Delivery = inboxtype.NewDelivery("q", "payments", "w1", msg.Delivery.Raw, obs)
	err := h.Handle(t.Context(), msg)
	require.ErrorIs(t, err, inbox.ErrLeaseLost)
	d := retry.Classify(err)
	require.Equal(t, retry.KindRetry, d.Kind)
	require.Equal(t, inbox.ReasonLeaseLost, d.Reason)
	// Extended past the first lease, and never past the cap.
	require.Greater(t, final.Sub(initial), 400*time.Millisecond)
	require.LessOrEqual(t, final.Sub(initial), opts.MaxLease)
	require.Contains(t, obs.statuses(), inboxtype.StatusLockExpired)

	r := b.get(t, "payments", "order:hb")
	require.Equal(t, inbox.RecordFailed, r.Status)
	require.Nil(t, r.Owner)
	require.Contains(t, *r.LastError, "lease lost")
}

func TestClaim_TakenOverWhileRunningCancelsTheHandler(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	opts := &inbox.ClaimOpts{Lease: 3 * time.Second, Heartbeat: 50 * time.Millisecond}
	h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		if _, err := b.pool.Exec(ctx, `UPDATE inboxmq_inbox SET owner = 'another-worker', fence = fence + 1`); err != nil {
			return err
		}
		<-ctx.Done()
		return context.Cause(ctx)
	}, nil, opts)
	err := h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "t"}, false))
	require.ErrorIs(t, err, inbox.ErrLeaseLost)
	r := b.get(t, "payments", "order:t")
	require.Equal(t, inbox.RecordProcessing, r.Status, "the release is fenced: the new owner's claim stays")
	require.Equal(t, "another-worker", *r.Owner)
}

func TestClaim_RecoveryPointsSkipCompletedSteps(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	charge, email := &gateway{}, &gateway{}
	var attempt atomic.Int64
	var results []json.RawMessage
	h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		attempt.Add(1)
		r, err := c.Step(ctx, "charge", func(ctx context.Context) (any, error) { return charge.charge(ctx, c.Key) })
		if err != nil {
			return err
		}
		results = append(results, r)
		if c.Fence == 1 { // the first claim of the key
			return errors.New("crashed between the charge and the e-mail")
		}
		if _, err := c.Step(ctx, "email", func(ctx context.Context) (any, error) { return email.charge(ctx, c.Key) }); err != nil {
			return err
		}
		return c.Complete(ctx, completeWithEffect(msg))
	}, nil, nil)
	require.ErrorContains(t, h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "s"}, false)), "crashed")
	r := b.get(t, "payments", "order:s")
	require.Equal(t, inbox.RecordFailed, r.Status)
	require.Contains(t, r.Steps, "charge")

	require.NoError(t, h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "s"}, false)))
	require.Equal(t, int64(2), attempt.Load())
	require.Equal(t, int64(1), charge.calls.Load())
	require.Equal(t, int64(1), email.calls.Load())
	require.Len(t, results, 2)
	require.JSONEq(t, string(results[0]), string(results[1]))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
	r = b.get(t, "payments", "order:s")
	require.Equal(t, inbox.RecordCompleted, r.Status)
	require.Len(t, r.Steps, 2)
}

func TestClaim_NilWithoutCompleteCompletes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var calls atomic.Int64
	h := inbox.ClaimHandler(b.store, func(context.Context, *inbox.Claim, *inboxtype.Message[order]) error {
		calls.Add(1)
		return nil
	}, nil, nil)
	require.NoError(t, h.Handle(t.Context(), newMsg(t, "mailer", order{OrderID: "m"}, false)))
	require.ErrorIs(t, h.Handle(t.Context(), newMsg(t, "mailer", order{OrderID: "m"}, false)), retry.ErrDuplicate)
	err := h.Handle(t.Context(), newMsg(t, "mailer", order{OrderID: "m", Amount: 3}, false))
	require.ErrorIs(t, err, retry.ErrKeyConflict)
	require.Equal(t, int64(1), calls.Load())
	require.Equal(t, inbox.RecordCompleted, b.get(t, "mailer", "order:m").Status)
}

func TestClaim_FailedCompleteRollsBackAndReleases(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if err := completeWithEffect(msg)(ctx, tx); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT 1/0`)
			return err
		})
	}, nil, nil)
	require.ErrorContains(t, h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "f"}, false)), "division by zero")
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM effects`))
	r := b.get(t, "payments", "order:f")
	require.Equal(t, inbox.RecordFailed, r.Status)
	require.Equal(t, 1, r.Attempts)
	require.Nil(t, r.Owner)
}

func TestClaimOpts_Invalid(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	require.Panics(t, func() {
		inbox.ClaimHandler(b.store, func(context.Context, *inbox.Claim, *inboxtype.Message[order]) error { return nil },
			nil, &inbox.ClaimOpts{Lease: time.Minute, MaxLease: time.Second})
	})
}
