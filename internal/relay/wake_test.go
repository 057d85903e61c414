package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/outbox"
)

// Rows enqueued under WakeLocally send no NOTIFY, so the relay (polling
// hourly) leaves them until done wakes it in-process; then it publishes
// them. A plain enqueue still sends its NOTIFY.
func TestWakeLocallyWakesWithoutNotify(t *testing.T) {
	t.Parallel()
	b, tc := tracedBundle(t)
	r, _ := b.newRelay(t, &Config{Concurrency: 1, Retention: -1, PollInterval: time.Hour})
	idle := make(chan bool, 16)
	r.hooks.idle = func(wakePending bool) { idle <- wakePending }
	listening := make(chan struct{}, 1)
	r.hooks.listening = func() { notify(listening) }
	start(t, r)
	testenv.WaitChan(t, listening, "the relay's LISTEN")
	// The lane settles idle: the start's claim and the LISTEN connection's
	// wake-up are behind it once it stays idle for a moment.
	for settled := false; !settled; {
		select {
		case <-idle:
		case <-time.After(150 * time.Millisecond):
			settled = true
		}
	}

	ctx, done := r.WakeLocally(t.Context())
	tc.reset()
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		return outbox.Enqueue(ctx, tx, msgTo(b.queue, "local"))
	}))
	require.Equal(t, 1, tc.count("insert"), "the row alone, no NOTIFY")
	require.Zero(t, tc.count("insert | select"))
	select {
	case <-idle:
		t.Fatal("the relay woke without done")
	case <-time.After(200 * time.Millisecond): // nothing wakes it: no NOTIFY, an hourly poll
	}
	require.Equal(t, 1, countRows(t, b.pool, "sent_at IS NULL"), "still pending before done")

	done()
	waitAllSent(t, b.pool, 1)

	enqueue(t, b.pool, msgTo(b.queue, "notified"))
	require.Equal(t, 1, tc.count("insert | select"), "a plain enqueue sends its NOTIFY")
	waitAllSent(t, b.pool, 2)

	// Nothing enqueued under it: done wakes nobody.
	_, done = r.WakeLocally(context.Background())
	done()
	require.Empty(t, r.wake)
}
