package inbox_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/logtest"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/migrations"
	"github.com/inboxmq/inboxmq/retry"
)

// The owner processes of these tests are this test binary run again
// (TestOwnerProcess): a worker that claims one key in claim mode and stops
// at a stage the parent names, so that the parent can kill or pause a
// real process there and play the redelivered copy.
const (
	ownerStageEnv  = "INBOXMQ_TEST_OWNER_STAGE"
	ownerSchemaEnv = "INBOXMQ_TEST_OWNER_SCHEMA"
)

// outsideCalls is the downstream of these tests: a table written outside
// the claim's transaction, as a gateway would record a call.
const outsideCalls = `CREATE TABLE IF NOT EXISTS outside_calls (key text NOT NULL, fence bigint NOT NULL, state text NOT NULL)`

// TestOwnerProcess is the owner process; it does nothing in a normal run.
func TestOwnerProcess(t *testing.T) {
	t.Parallel()
	stage := os.Getenv(ownerStageEnv)
	if stage == "" {
		return
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.URL(os.Getenv(ownerSchemaEnv)))
	require.NoError(t, err)
	store, err := inbox.NewStore(pool, nil)
	require.NoError(t, err)
	require.NoError(t, store.Check(ctx))
	require.NoError(t, store.Start(ctx))
	say := func(s string) { fmt.Println(s) } //nolint:forbidigo // the parent reads the stages from stdout
	opts := &inbox.ClaimOpts{Lease: time.Minute}
	if stage == "paused" {
		opts = &inbox.ClaimOpts{Lease: time.Second, Heartbeat: 500 * time.Millisecond}
	}
	h := inbox.ClaimHandler(store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		call := func(state string) {
			_, err := pool.Exec(ctx, `INSERT INTO outside_calls VALUES ($1, $2, $3)`, c.Key, c.Fence, state)
			require.NoError(t, err)
		}
		switch stage {
		case "before":
			say("before")
			select {}
		case "during":
			call("started")
			say("during")
			select {}
		case "after":
			call("started")
			call("done")
			say("after")
			select {}
		}
		// paused: wait for the parent's word, then complete.
		say("claimed")
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		return c.Complete(ctx, completeWithEffect(msg))
	}, nil, opts)
	err = h.Handle(ctx, newMsg(t, "payments", order{OrderID: "owned", Amount: 7}, false))
	say(fmt.Sprintf("handled: %v", err))
}

// owned is an owner process at a stage.
type owned struct {
	cmd   *exec.Cmd
	lines *bufio.Scanner
	stdin io.WriteCloser
}

func startOwner(t *testing.T, schema, stage string) *owned {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestOwnerProcess$", "-test.count=1") //nolint:gosec // this test binary
	cmd.Env = append(os.Environ(), ownerStageEnv+"="+stage, ownerSchemaEnv+"="+schema)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return &owned{cmd: cmd, lines: bufio.NewScanner(out), stdin: in}
}

// await reads the owner's output up to the line that starts with prefix.
func (o *owned) await(t *testing.T, prefix string) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		for o.lines.Scan() {
			if l := o.lines.Text(); strings.HasPrefix(l, prefix) {
				got <- l
				return
			}
		}
		close(got)
	}()
	line, ok := <-got
	if !ok {
		t.Fatalf("the owner process ended before %q", prefix)
	}
	return line
}

// ownerSession returns the owner session the key's claim names.
func ownerSession(t *testing.T, b *testBundle, key string) int64 {
	t.Helper()
	var s *int64
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT owner_session FROM inboxmq_inbox WHERE key = $1`, key).Scan(&s))
	require.NotNil(t, s, "a started store's claim names its owner session")
	return *s
}

// sessionHeld reports whether an owner session's lock is still held.
func sessionHeld(t *testing.T, b *testBundle, key int64) bool {
	t.Helper()
	var held bool
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT EXISTS (SELECT 1 FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND classid = ($1::bigint >> 32)::oid
			AND objid = ($1::bigint & 4294967295)::oid)`, key).Scan(&held))
	return held
}

// takeOver plays the redelivered copy: it claims the key, makes the
// outside call and completes. It returns the handler's error and the fence
// it ran under (0 if it did not run).
func takeOver(t *testing.T, b *testBundle) (int64, error) {
	t.Helper()
	var fence int64
	h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		fence = c.Fence
		if _, err := b.pool.Exec(ctx, `INSERT INTO outside_calls VALUES ($1, $2, 'started'), ($1, $2, 'done')`, c.Key, c.Fence); err != nil {
			return err
		}
		return c.Complete(ctx, completeWithEffect(msg))
	}, nil, &inbox.ClaimOpts{Lease: time.Minute})
	err := h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "owned", Amount: 7}, true))
	return fence, err
}

// A worker killed while it holds a claim frees it at once: the copy the
// broker redelivers takes the claim within the dead owner's lease (a
// minute), fenced, and the key is completed once — whether the owner died
// before its outside call, during it or after it.
func TestClaim_DeadOwnerIsTakenOverAtOnce(t *testing.T) {
	t.Parallel()
	for _, stage := range []string{"before", "during", "after"} {
		t.Run(stage, func(t *testing.T) {
			t.Parallel()
			pool, schema := pgtest.Schema(t)
			b := setupOn(t, pool, nil)
			_, err := b.pool.Exec(t.Context(), outsideCalls)
			require.NoError(t, err)

			owner := startOwner(t, schema, stage)
			owner.await(t, stage)
			session := ownerSession(t, b, "order:owned")
			require.NoError(t, owner.cmd.Process.Kill())
			_ = owner.cmd.Wait()
			// PostgreSQL ends the dead process's sessions when it reads
			// their closed sockets.
			testenv.WaitFor(t, "the dead owner's session to end", func() bool { return !sessionHeld(t, b, session) })

			var leaseLeft time.Duration
			require.NoError(t, b.pool.QueryRow(t.Context(),
				`SELECT (extract(epoch FROM lease_until - now()) * 1e6)::bigint * interval '1 microsecond' FROM inboxmq_inbox WHERE key = 'order:owned'`).Scan(&leaseLeft))
			require.Greater(t, leaseLeft, 30*time.Second, "the dead owner's lease still runs")

			fence, err := takeOver(t, b)
			require.NoError(t, err, "the copy takes the dead owner's claim without waiting for its lease")
			require.Equal(t, int64(2), fence)

			r := b.get(t, "payments", "order:owned")
			require.Equal(t, inbox.RecordCompleted, r.Status)
			require.Equal(t, int64(2), r.Fence)
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
			// The downstream saw the dead owner's call (if it got that
			// far) and the new owner's, both under the same key: it is the
			// key that lets it answer the second from the first.
			var fences []int64
			rows, err := b.pool.Query(t.Context(), `SELECT DISTINCT fence FROM outside_calls WHERE key = 'order:owned' ORDER BY fence`)
			require.NoError(t, err)
			fences, err = pgx.CollectRows(rows, pgx.RowTo[int64])
			require.NoError(t, err)
			if stage == "before" {
				require.Equal(t, []int64{2}, fences)
			} else {
				require.Equal(t, []int64{1, 2}, fences)
			}
		})
	}
}

// A paused owner (SIGSTOP) keeps its session: PostgreSQL cannot see it is
// stuck, so its claim waits out its lease — the backstop — and is then
// taken over. When the owner wakes, its completion is fenced out.
func TestClaim_PausedOwnerWakesAfterTakeoverAndIsFencedOut(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	b := setupOn(t, pool, nil)
	_, err := b.pool.Exec(t.Context(), outsideCalls)
	require.NoError(t, err)

	owner := startOwner(t, schema, "paused")
	owner.await(t, "claimed")
	session := ownerSession(t, b, "order:owned")
	require.NoError(t, owner.cmd.Process.Signal(syscall.SIGSTOP))

	// Within the lease, the live session holds the claim.
	require.True(t, sessionHeld(t, b, session))
	_, err = takeOver(t, b)
	if !errors.Is(err, inbox.ErrLeaseLost) { // the lease may have run out already on a slow machine
		require.Equal(t, inbox.ReasonClaimHeld, retry.Classify(err).Reason, "a live owner's claim is held: %v", err)
	}
	testenv.WaitFor(t, "the paused owner's lease to run out", func() bool {
		return b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE key = 'order:owned' AND lease_until <= now()`) == 1
	})
	fence, err := takeOver(t, b)
	require.NoError(t, err)
	require.Equal(t, int64(2), fence)
	require.True(t, sessionHeld(t, b, session), "the takeover came from the lease, not from the session")

	require.NoError(t, owner.cmd.Process.Signal(syscall.SIGCONT))
	_, err = io.WriteString(owner.stdin, "go\n")
	require.NoError(t, err)
	line := owner.await(t, "handled:")
	require.NotEqual(t, "handled: <nil>", line, "the woken owner's completion must fail")

	r := b.get(t, "payments", "order:owned")
	require.Equal(t, inbox.RecordCompleted, r.Status)
	require.Equal(t, int64(2), r.Fence)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
}

// An owner whose session the database ended (a killed backend, a server
// restart) while the process lives goes on with its handler, and its new
// session adopts the claim: a copy is then held as by any live owner, and
// the owner completes.
func TestClaim_LiveOwnerAdoptsItsClaimsInANewSession(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	require.NoError(t, b.store.Start(t.Context()))
	t.Cleanup(func() { require.NoError(t, b.store.Stop(context.Background())) })

	claimed, proceed := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		close(claimed)
		<-proceed
		return c.Complete(ctx, completeWithEffect(msg))
	}, nil, &inbox.ClaimOpts{Lease: time.Minute})
	go func() {
		done <- h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "owned", Amount: 7}, false))
	}()
	testenv.WaitChan(t, claimed, "the claim")
	session := ownerSession(t, b, "order:owned")

	terminateSession(t, b, session)
	testenv.WaitFor(t, "the new session to adopt the claim", func() bool {
		return ownerSession(t, b, "order:owned") != session
	})
	require.True(t, sessionHeld(t, b, ownerSession(t, b, "order:owned")))

	_, err := takeOver(t, b)
	require.Equal(t, inbox.ReasonClaimHeld, retry.Classify(err).Reason, "an adopted claim is held: %v", err)
	close(proceed)
	require.NoError(t, testenv.WaitChan(t, done, "the owner completes"))
	r := b.get(t, "payments", "order:owned")
	require.Equal(t, inbox.RecordCompleted, r.Status)
	require.Equal(t, int64(1), r.Fence)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
}

// A claim whose owner session is gone and not replaced (here the store
// stopped holding it; in life, the process died) is taken over at once by
// another worker's copy, and a late completion of the old owner is fenced
// out.
func TestClaim_OwnerWithoutSessionIsTakenOverAndFencedOut(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, err := b.pool.Exec(t.Context(), outsideCalls)
	require.NoError(t, err)
	require.NoError(t, b.store.Start(t.Context()))

	claimed, proceed := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		close(claimed)
		<-proceed
		return c.Complete(ctx, completeWithEffect(msg))
	}, nil, &inbox.ClaimOpts{Lease: time.Minute})
	go func() {
		done <- h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "owned", Amount: 7}, false))
	}()
	testenv.WaitChan(t, claimed, "the claim")
	session := ownerSession(t, b, "order:owned")
	require.NoError(t, b.store.Stop(t.Context()))
	testenv.WaitFor(t, "the session's lock to go", func() bool { return !sessionHeld(t, b, session) })

	// Another worker on the same inbox.
	otherStore, err := inbox.NewStore(b.pool, nil)
	require.NoError(t, err)
	require.NoError(t, otherStore.Check(t.Context()))
	fence, err := takeOver(t, &testBundle{pool: b.pool, store: otherStore})
	require.NoError(t, err, "the copy takes the claim of a session gone")
	require.Equal(t, int64(2), fence)
	close(proceed)
	require.ErrorIs(t, testenv.WaitChan(t, done, "the old owner's completion"), retry.ErrDuplicate)

	r := b.get(t, "payments", "order:owned")
	require.Equal(t, inbox.RecordCompleted, r.Status)
	require.Equal(t, int64(2), r.Fence)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
}

// terminateSession ends the backend holding an owner session's lock.
func terminateSession(t *testing.T, b *testBundle, key int64) {
	t.Helper()
	_, err := b.pool.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND classid = ($1::bigint >> 32)::oid
			AND objid = ($1::bigint & 4294967295)::oid`, key)
	require.NoError(t, err)
}

// A release that fails while the database cannot answer is not left to the
// lease: a started store releases the claim once the database answers.
func TestClaim_FailedReleaseIsRetriedWhenTheDatabaseAnswers(t *testing.T) {
	t.Parallel()
	b := setup(t, &inbox.StoreConfig{CleanupTimeout: 200 * time.Millisecond})
	require.NoError(t, b.store.Start(t.Context()))
	t.Cleanup(func() { require.NoError(t, b.store.Stop(context.Background())) })

	// Another session locks the row while the handler fails, so that the
	// release cannot get through within CleanupTimeout.
	blocker, err := b.pool.Begin(t.Context())
	require.NoError(t, err)
	h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		if _, err := blocker.Exec(ctx, `SELECT 1 FROM inboxmq_inbox WHERE key = $1 FOR UPDATE`, c.Key); err != nil {
			return err
		}
		return errors.New("gateway: 503")
	}, nil, &inbox.ClaimOpts{Lease: time.Minute})
	err = h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "owned", Amount: 7}, false))
	require.ErrorContains(t, err, "gateway: 503")
	require.Equal(t, inbox.RecordProcessing, b.get(t, "payments", "order:owned").Status, "the release did not get through")

	require.NoError(t, blocker.Rollback(t.Context()))
	testenv.WaitFor(t, "the kept release", func() bool {
		return b.get(t, "payments", "order:owned").Status == inbox.RecordFailed
	})
	r := b.get(t, "payments", "order:owned")
	require.Nil(t, r.Owner)
	require.Contains(t, *r.LastError, "gateway: 503")
}

// The database restarts under a worker (a server of the test's own): the
// release of a claim whose handler failed while it was down is not left
// to the lease. It goes through once the server answers, and the copy
// that retries the message takes the key at once; nothing says "after its
// lease".
func TestClaim_ServerRestartLeavesNoClaimToItsLease(t *testing.T) {
	t.Parallel()
	srv := pgtest.StartPrimary(t)
	pool, err := pgxpool.New(t.Context(), srv.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, migrations.Up(t.Context(), pool))
	logger, logs := logtest.New(slog.LevelDebug)
	b := setupOn(t, pool, &inbox.StoreConfig{Logger: logger, CleanupTimeout: 500 * time.Millisecond})
	_, err = b.pool.Exec(t.Context(), outsideCalls)
	require.NoError(t, err)
	require.NoError(t, b.store.Start(t.Context()))
	t.Cleanup(func() { require.NoError(t, b.store.Stop(context.Background())) })

	claimed, proceed := make(chan struct{}), make(chan struct{})
	h := inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
		close(claimed)
		<-proceed
		return errors.New("gateway: 503")
	}, nil, &inbox.ClaimOpts{Lease: time.Minute})
	done := make(chan error, 1)
	go func() {
		done <- h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "owned", Amount: 7}, false))
	}()
	testenv.WaitChan(t, claimed, "the claim")

	srv.Stop(t)
	close(proceed)
	require.ErrorContains(t, testenv.WaitChan(t, done, "the failed attempt"), "gateway: 503")
	srv.Start(t)

	testenv.WaitFor(t, "the kept release to go through", func() bool {
		r, err := b.store.Get(t.Context(), "payments", "order:owned")
		return err == nil && r.Status == inbox.RecordFailed
	})
	fence, err := takeOver(t, b)
	require.NoError(t, err, "the retry takes the key at once")
	require.Equal(t, int64(2), fence)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
	require.NotEmpty(t, logs.Containing("released when PostgreSQL answers again"))
	require.Empty(t, logs.Containing("after its lease"))
}
