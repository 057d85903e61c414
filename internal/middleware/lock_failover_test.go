package middleware_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/lock"
	"github.com/inboxmq/inboxmq/internal/middleware"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

type charge struct {
	OrderID string `json:"order_id"`
}

func (c charge) IdempotencyKey() string { return "charge:" + c.OrderID }

// lockedStatus is an observer that signals when the lock middleware
// reports the delivery locked.
type lockedStatus struct {
	inboxtype.NopObserver
	locked chan struct{}
}

func (o *lockedStatus) OnTransition(_ *inboxtype.Delivery, status inboxtype.Status, _ error) {
	if status == inboxtype.StatusLocked {
		close(o.locked)
	}
}

// chargeDelivery is a delivery of c for consumer "payments", as the
// consumer hands it to a route's chain, and the typed message the inbox
// handler gets from it.
func chargeDelivery(t *testing.T, c charge, redelivered bool, obs ...inboxtype.Observer) (*inboxtype.Delivery, *inboxtype.Message[charge]) {
	t.Helper()
	body, err := json.Marshal(c)
	require.NoError(t, err)
	d := inboxtype.NewDelivery("payments", "payments", "worker", &amqp.Delivery{MessageId: c.OrderID, Body: body, Redelivered: redelivered}, obs...)
	d.Key = c.IdempotencyKey()
	d.Value = &c
	return d, &inboxtype.Message[charge]{
		ID: d.MessageID, Key: d.Key, Namespace: d.Namespace, Body: c, Headers: d.Headers,
		Attempt: d.Attempt, Redelivered: redelivered, Delivery: d,
	}
}

// A Redis fail-over loses a lock (the new primary never saw it) while its
// holder is in flight: a second worker obtains the same key's lock, and
// the Redis fence, lost with it, does not even increase. The inbox still
// gives one effect: in transactional mode the second delivery waits on the
// first's inbox row and is a duplicate; in claim mode it finds the first's
// live claim and is deferred, never charging twice, and its redelivery is
// a duplicate.
func TestLock_LostInFailoverInboxKeepsOneEffect(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"transactional", "claim"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testLockLostInFailover(t, mode)
		})
	}
}

func testLockLostInFailover(t *testing.T, mode string) {
	ctx := t.Context()
	rb := setupRedis(t)
	pool, _ := pgtest.Schema(t)
	_, err := pool.Exec(ctx, `CREATE TABLE charges (key text NOT NULL)`)
	require.NoError(t, err)
	store, err := inbox.NewStore(pool, nil)
	if err == nil {
		err = store.Check(ctx)
	}
	require.NoError(t, err)

	var outside atomic.Int64 // claim mode's outside calls (the gateway's charges)
	entered, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	first.Store(true)
	hold := func() {
		if first.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
	}
	var h inboxtype.Handler[charge]
	if mode == "claim" {
		h = inbox.ClaimHandler(store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[charge]) error {
			outside.Add(1)
			hold()
			return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO charges (key) VALUES ($1)`, msg.Key)
				return err
			})
		}, nil, nil)
	} else {
		h = inbox.Handler(store, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[charge]) error {
			if _, err := tx.Exec(ctx, `INSERT INTO charges (key) VALUES ($1)`, msg.Key); err != nil {
				return err
			}
			hold()
			return nil
		}, nil)
	}
	// Two workers: a lock middleware each, on one Redis.
	opts := &middleware.LockOpts{Prefix: rb.prefix, TTL: 30 * time.Second}
	chain := func(msg *inboxtype.Message[charge]) inboxtype.DeliveryHandler {
		return mustLock(t, rb.rdb, opts)(func(ctx context.Context, _ *inboxtype.Delivery) error { return h.Handle(ctx, msg) })
	}

	c := charge{OrderID: "42"}
	dA, mA := chargeDelivery(t, c, false)
	resA := make(chan error, 1)
	go func() { resA <- chain(mA)(ctx, dA) }()
	testenv.WaitChan(t, entered, "worker A is in flight, holding the lock")
	require.Equal(t, middleware.LockAcquired, dA.LockResult)

	// The fail-over: the new Redis primary has neither the lock nor its
	// fencing counter.
	lockKey, fenceKey := lock.RedisKeys(rb.prefix + "payments:" + c.IdempotencyKey())
	require.Equal(t, int64(2), rb.rdb.Del(ctx, lockKey, fenceKey).Val(), "the lock and its fence existed")

	obs := &lockedStatus{locked: make(chan struct{})}
	dB, mB := chargeDelivery(t, c, false, obs)
	resB := make(chan error, 1)
	go func() { resB <- chain(mB)(ctx, dB) }()
	testenv.WaitChan(t, obs.locked, "worker B obtained the lost lock")
	require.Equal(t, middleware.LockAcquired, dB.LockResult, "the lock no longer protects the key")
	require.LessOrEqual(t, dB.LockFence, dA.LockFence, "the Redis fence was lost with the lock")

	if mode == "claim" {
		// B finds A's live claim before any outside call.
		errB := testenv.WaitChan(t, resB, "worker B settled")
		d := retry.Classify(errB)
		require.Equal(t, inbox.ReasonClaimHeld, d.Reason, "%v", errB)
		require.Equal(t, retry.KindRetry, d.Kind)
		require.True(t, d.Uncounted, "deferred, not a failed attempt")
		close(release)
		require.NoError(t, testenv.WaitChan(t, resA, "worker A settled"))
	} else {
		// B waits on A's inbox row; A commits; B is a duplicate.
		close(release)
		require.NoError(t, testenv.WaitChan(t, resA, "worker A settled"))
		require.ErrorIs(t, testenv.WaitChan(t, resB, "worker B settled"), retry.ErrDuplicate)
	}

	// A redelivery of the key (B's retry) is a duplicate.
	dC, mC := chargeDelivery(t, c, true)
	require.ErrorIs(t, chain(mC)(ctx, dC), retry.ErrDuplicate)

	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&n))
	require.Equal(t, 1, n, "one effect")
	if mode == "claim" {
		require.Equal(t, int64(1), outside.Load(), "one outside call")
	}
	r, err := store.Get(ctx, "payments", c.IdempotencyKey())
	require.NoError(t, err)
	require.Equal(t, inbox.RecordCompleted, r.Status)
}
