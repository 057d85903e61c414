package inbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/internal/startstop"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// staleClaim inserts a claim whose worker vanished: its lease ended an
// hour ago, and its key has been claimed claims times (broker attempt 1).
func (b *testBundle) staleClaim(t *testing.T, namespace, key string, claims int) {
	t.Helper()
	_, err := b.pool.Exec(t.Context(), `INSERT INTO inboxmq_inbox
		(consumer, key, status, owner, fence, lease_until, attempts, last_error)
		VALUES ($1, $2, 'processing', 'gone-worker', $3, now() - interval '1 hour', 1, 'gateway timeout')`,
		namespace, key, claims)
	require.NoError(t, err)
}

func effectPresent(ctx context.Context, tx pgx.Tx, _, key string) (bool, error) {
	var ok bool
	err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM effects WHERE key = $1)`, key).Scan(&ok)
	return ok, err
}

func TestReconciler_DecidesFromEvidence(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.staleClaim(t, "payments", "paid", 1)
	b.staleClaim(t, "payments", "unpaid", 1)
	b.staleClaim(t, "payments", "hopeless", 5)
	b.staleClaim(t, "mailer", "mail", 1)
	_, err := b.pool.Exec(t.Context(), `INSERT INTO effects (key, amount) VALUES ('paid', 1);
		INSERT INTO inboxmq_inbox (consumer, key, status, owner, fence, lease_until, attempts)
		VALUES ('payments', 'live', 'processing', 'busy-worker', 1, now() + interval '1 hour', 1)`)
	require.NoError(t, err)

	var mu sync.Mutex
	stale := map[string]int{}
	r, err := inbox.NewReconciler(b.store, &inbox.ReconcilerConfig{
		MaxAttempts:  5,
		EffectChecks: map[string]inbox.EffectCheck{"payments": effectPresent},
		OnStale: func(c string, n int) {
			mu.Lock()
			defer mu.Unlock()
			stale[c] += n
		},
	})
	require.NoError(t, err)

	found, err := b.store.Stale(t.Context(), time.Minute)
	require.NoError(t, err)
	require.Len(t, found, 4)

	dry, err := r.RunOnce(t.Context(), true)
	require.NoError(t, err)
	require.Len(t, dry.Claims, 4)
	require.Zero(t, dry.Completed+dry.Released+dry.Dead)
	require.Equal(t, 4, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE status = 'processing' AND owner = 'gone-worker'`))

	rep, err := r.RunOnce(t.Context(), false)
	require.NoError(t, err)
	require.Equal(t, 1, rep.Completed)
	require.Equal(t, 2, rep.Released)
	require.Equal(t, 1, rep.Dead)
	require.Equal(t, inbox.RecordCompleted, b.get(t, "payments", "paid").Status)
	require.Equal(t, inbox.RecordFailed, b.get(t, "payments", "unpaid").Status)
	require.Equal(t, inbox.RecordDead, b.get(t, "payments", "hopeless").Status)
	mail := b.get(t, "mailer", "mail")
	require.Equal(t, inbox.RecordFailed, mail.Status)
	require.Nil(t, mail.Owner)
	require.Contains(t, *mail.LastError, "gone-worker")
	require.Equal(t, inbox.RecordProcessing, b.get(t, "payments", "live").Status)

	mu.Lock()
	require.Equal(t, map[string]int{"payments": 6, "mailer": 2}, stale) // dry run + real run
	mu.Unlock()

	rep, err = r.RunOnce(t.Context(), false)
	require.NoError(t, err)
	require.Empty(t, rep.Claims)
}

func TestReconciler_ConcurrentRunsActOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	const n = 40
	for i := range n {
		b.staleClaim(t, "payments", fmt.Sprintf("k%02d", i), 1)
	}
	var mu sync.Mutex
	checked := map[string]int{}
	check := func(ctx context.Context, tx pgx.Tx, c, key string) (bool, error) {
		mu.Lock()
		checked[key]++
		mu.Unlock()
		return false, nil
	}
	reps := make([]inbox.ReconcileReport, 2)
	var wg sync.WaitGroup
	for i := range reps {
		r, err := inbox.NewReconciler(b.store, &inbox.ReconcilerConfig{EffectChecks: map[string]inbox.EffectCheck{"payments": check}})
		require.NoError(t, err)
		wg.Go(func() {
			rep, err := r.RunOnce(t.Context(), false)
			if err == nil {
				reps[i] = rep
			}
		})
	}
	wg.Wait()
	require.Equal(t, n, reps[0].Released+reps[1].Released)
	require.Len(t, checked, n)
	for k, c := range checked {
		require.Equal(t, 1, c, k)
	}
	require.Equal(t, n, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE status = 'failed'`))
}

// TestReconciler_StartStop: a started reconciler runs in the background
// until Stop; Stop without Start and Stop twice are safe, a second Start
// is refused.
func TestReconciler_StartStop(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.staleClaim(t, "payments", "loop", 1)
	r, err := inbox.NewReconciler(b.store, &inbox.ReconcilerConfig{Interval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, r.Stop(t.Context()), "Stop without Start")
	ctx, cancel := context.WithCancel(t.Context())
	require.NoError(t, r.Start(ctx))
	cancel() // ctx bounds only the start
	require.ErrorIs(t, r.Start(t.Context()), startstop.ErrAlreadyStarted)
	testenv.WaitFor(t, "stale claim released", func() bool {
		rec, err := b.store.Get(t.Context(), "payments", "loop")
		return err == nil && rec.Status == inbox.RecordFailed
	})
	stopped := r.Stopped()
	require.NoError(t, r.Stop(t.Context()))
	select {
	case <-stopped:
	default:
		t.Fatal("Stop returned before the loop ended")
	}
	require.NoError(t, r.Stop(t.Context()), "Stop twice")
}
