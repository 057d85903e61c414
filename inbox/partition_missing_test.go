package inbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/logtest"
	"github.com/inboxmq/inboxmq/internal/metrics"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/migrations"
	"github.com/inboxmq/inboxmq/retry"
)

// A partitioned inbox whose partitions ahead ran out (no retention job
// created the next ones) fails every insert with SQLSTATE 23514 "no
// partition of relation … found for row". That is the infrastructure's
// fault, not the message's: the delivery is retried (never dead-lettered),
// and the store creates the missing partitions itself where its role may.

// partitionsRunOut partitions pool's inbox table in buckets of one second
// with one partition ahead, and waits (on the database's clock) until the
// last partition's span has passed: an insert then finds no partition.
func partitionsRunOut(t *testing.T, pool *pgxpool.Pool) *migrations.Partitioning {
	t.Helper()
	p, err := migrations.PartitionInbox(t.Context(), pool, &migrations.PartitionConfig{Width: time.Second, Ahead: 1})
	require.NoError(t, err)
	waitPartitionsRunOut(t, pool, p)
	return p
}

// waitPartitionsRunOut waits until the database's clock has passed the
// upper bound of p's last partition.
func waitPartitionsRunOut(t *testing.T, pool *pgxpool.Pool, p *migrations.Partitioning) {
	t.Helper()
	var last time.Time
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT max(m[1]::timestamptz) FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid,
		LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)') m
		WHERE i.inhparent = to_regclass($1)`, p.Table).Scan(&last))
	testenv.WaitFor(t, "the last partition's span has passed", func() bool {
		var past bool
		err := pool.QueryRow(t.Context(), `SELECT now() >= $1`, last).Scan(&past)
		return err == nil && past
	})
}

// partitionCovers reports whether p has a partition for the database's now.
func partitionCovers(t *testing.T, pool *pgxpool.Pool, p *migrations.Partitioning) bool {
	t.Helper()
	var ok bool
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT to_regclass($1) IS NOT NULL`,
		p.PartitionName(p.Bucket(dbNow(t, pool)))).Scan(&ok))
	return ok
}

func dbNow(t *testing.T, pool *pgxpool.Pool) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT now()`).Scan(&now))
	return now
}

// requireNoPartitionRetry requires err to be the retryable verdict on a
// missing partition.
func requireNoPartitionRetry(t *testing.T, err error) {
	t.Helper()
	d := retry.Classify(err)
	require.Equal(t, retry.KindRetry.String(), d.Kind.String(), "a missing partition is retried, never dead-lettered: %v", err)
	require.Equal(t, inbox.ReasonDBNoPartition, d.Reason, "%v", err)
}

// The reproduction through the consumer and the broker: the delivery that
// meets the missing partition is retried with reason db_no_partition —
// through a retry queue, or first in process — the store creates the
// partitions, and the retry completes the job once; the retry metrics
// count it under that reason. Before the fix it was dead-lettered at once
// as db_integrity_violation.
func TestPartitionedInbox_MissingPartitionIsRetriedNotDeadLettered(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		inProcess retry.InProcess
	}{
		{"broker retry", retry.InProcess{Tries: -1}},
		{"in-process retry", retry.InProcess{Tries: 5, InitialInterval: 10 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := unpartitioned(t)
			p := partitionsRunOut(t, pool)
			logger, logs := logtest.New(slog.LevelInfo)
			b := setupOn(t, pool, &inbox.StoreConfig{Logger: logger})
			queue := amqptest.QueueName(t)
			reg := prometheus.NewRegistry()
			m, err := metrics.New(reg, nil)
			require.NoError(t, err)
			m.Init(queue, "payments")
			obs := &outcomes{ch: make(chan inboxtype.Outcome, 64)}
			r := consumer.NewRouter()
			consumer.Register(r, queue, inbox.Handler(b.store, effectHandler(nil), nil), &consumer.HandlerOpts{
				Namespace: "payments",
				Policy:    retry.Exponential{InitialInterval: 10 * time.Millisecond, MaxAttempts: 10},
				InProcess: tc.inProcess,
				Queue:     consumer.QueueOpts{Concurrency: 2, RetryTiers: []time.Duration{50 * time.Millisecond, time.Second}},
			})
			c, err := consumer.New(&consumer.Config{URL: testenv.AMQPURL(), Router: r, Observers: []inboxtype.Observer{obs, m}})
			require.NoError(t, err)
			require.NoError(t, c.Start(t.Context()))
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = c.Stop(ctx)
			})
			amqptest.NewPublisher(t, amqptest.Dial(t)).Publish(queue, []byte(`{"order_id":"p1","amount":5}`), amqp.Publishing{MessageId: "m1"})

			// The retry finds the partitions the store created. (On a
			// machine so slow that they ran out again, it is retried again.)
			out := obs.next(t)
			for ; out.Action != inboxtype.ActionAcked; out = obs.next(t) {
				require.Equal(t, inboxtype.ActionRetried, out.Action, "decision %s (%s): %v", out.Decision.Kind, out.Decision.Reason, out.Decision.Err)
				require.Equal(t, inbox.ReasonDBNoPartition, out.Decision.Reason)
			}
			require.Equal(t, retry.KindSucceeded, out.Decision.Kind)
			retries := counter(t, reg, "inboxmq_job_retry_total", queue, inbox.ReasonDBNoPartition)
			require.GreaterOrEqual(t, retries, 1.0, "the retry is counted under reason db_no_partition")
			if tc.inProcess.Tries > 0 {
				require.Equal(t, retries, counter(t, reg, "inboxmq_in_process_retry_total", queue, inbox.ReasonDBNoPartition))
			}
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:p1'`))
			require.Equal(t, inbox.RecordCompleted, b.get(t, "payments", "order:p1").Status)
			created := logs.Message(inbox.LogPartitionsCreated)
			require.NotEmpty(t, created, "the store says it created the missing partitions")
			require.Equal(t, slog.LevelWarn, created[0].Level)
			require.Equal(t, p.Table, created[0].Attrs["table"])
		})
	}
}

// counter is the value of the counter name{queue, consumer="payments",
// reason}, which must exist.
func counter(t *testing.T, reg *prometheus.Registry, name, queue, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["queue"] == queue && labels["consumer"] == "payments" && labels["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no series %s{queue=%q, reason=%q}", name, queue, reason)
	return 0
}

// Every path that inserts an inbox row maps the missing partition to a
// retry and heals the table: per message, redelivered (the crash-loop
// counter inserts first), group commit, BatchHandler (alone and
// grouped), and claim mode (alone and with its claims combined).
// Concurrent deliveries hit it at once; none is permanent, and each one
// retried afterwards completes.
func TestPartitionedInbox_MissingPartitionRetryableInEveryMode(t *testing.T) {
	t.Parallel()
	group := &inbox.GroupCommit{MaxBatch: 4, MaxWait: 20 * time.Millisecond}
	claim := func(s *inbox.Store, gc *inbox.GroupCommit) inboxtype.Handler[order] {
		return inbox.ClaimHandler(s, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
			return c.Complete(ctx, completeWithEffect(msg))
		}, gc, nil)
	}
	modes := []struct {
		name        string
		handler     func(s *inbox.Store) inboxtype.Handler[order]
		redelivered bool
	}{
		{"handler", func(s *inbox.Store) inboxtype.Handler[order] { return inbox.Handler(s, effectHandler(nil), nil) }, false},
		{"handler redelivered", func(s *inbox.Store) inboxtype.Handler[order] { return inbox.Handler(s, effectHandler(nil), nil) }, true},
		{"group commit", func(s *inbox.Store) inboxtype.Handler[order] {
			return inbox.Handler(s, effectHandler(nil), group)
		}, false},
		{"batch handler", func(s *inbox.Store) inboxtype.Handler[order] {
			return inbox.BatchHandler(s, batchEffects(nil, nil), nil)
		}, false},
		{"batch handler group commit", func(s *inbox.Store) inboxtype.Handler[order] {
			return inbox.BatchHandler(s, batchEffects(nil, nil), group)
		}, false},
		{"claim", func(s *inbox.Store) inboxtype.Handler[order] { return claim(s, nil) }, false},
		{"claim redelivered", func(s *inbox.Store) inboxtype.Handler[order] { return claim(s, nil) }, true},
		{"claim group commit", func(s *inbox.Store) inboxtype.Handler[order] {
			return claim(s, group)
		}, false},
	}
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			pool := unpartitioned(t)
			p := partitionsRunOut(t, pool)
			logger, logs := logtest.New(slog.LevelInfo)
			b := setupOn(t, pool, &inbox.StoreConfig{Logger: logger})
			h := mode.handler(b.store)

			const n = 4
			msgs := make([]*inboxtype.Message[order], n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				msgs[i] = newMsg(t, "payments", order{OrderID: strconv.Itoa(i), Amount: i + 1}, mode.redelivered)
				wg.Go(func() { errs[i] = h.Handle(t.Context(), msgs[i]) })
			}
			wg.Wait()
			failed := 0
			for i, err := range errs {
				if err == nil {
					continue // claimed after the store created the partition
				}
				failed++
				requireNoPartitionRetry(t, err)
				// The retry of the delivery (as the consumer would run it).
				msgs[i].Attempt++
				require.NoError(t, h.Handle(t.Context(), msgs[i]))
			}
			require.Positive(t, failed, "the first insert found no partition")
			require.NotEmpty(t, logs.Message(inbox.LogPartitionsCreated))
			require.True(t, partitionCovers(t, pool, p))
			require.Equal(t, n, b.count(t, `SELECT count(*) FROM effects`), "one effect per key")
			require.Equal(t, n, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE status = 'completed'`))
		})
	}
}

// One creation at a time: while a creation waits (here on the partition
// lock, which the test holds as a slow ATTACH would), the deliveries that
// meet the missing partition meanwhile return their retry at once and
// start no creation of their own; when the lock is released, the one
// creation completes and is logged once.
func TestPartitionedInbox_OneCreationAtATime(t *testing.T) {
	t.Parallel()
	pool := unpartitioned(t)
	p := partitionsRunOut(t, pool)
	logger, logs := logtest.New(slog.LevelInfo)
	b := setupOn(t, pool, &inbox.StoreConfig{Logger: logger})
	h := inbox.Handler(b.store, effectHandler(nil), nil)

	// The lock that serialises partition creation (migrations.CreatePartitions).
	held, err := pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = held.Rollback(context.Background()) }()
	_, err = held.Exec(t.Context(), `SELECT pg_advisory_xact_lock(hashtext('inboxmq_partition'), hashtext($1))`, p.Table)
	require.NoError(t, err)
	waiters := func() int {
		var n int
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND classid = hashtext('inboxmq_partition')::oid AND objid = hashtext($1)::oid`, p.Table).Scan(&n))
		return n
	}

	first := make(chan error, 1)
	go func() { first <- h.Handle(context.Background(), newMsg(t, "payments", order{OrderID: "first"}, false)) }()
	testenv.WaitFor(t, "the first delivery's creation waits on the partition lock", func() bool { return waiters() == 1 })

	for i := range 8 {
		err := h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: fmt.Sprint("next-", i)}, false))
		requireNoPartitionRetry(t, err)
	}
	require.Equal(t, 1, waiters(), "no second creation started")
	require.Empty(t, logs.Message(inbox.LogPartitionsCreated))

	require.NoError(t, held.Rollback(t.Context()))
	requireNoPartitionRetry(t, testenv.WaitChan(t, first, "the first delivery"))
	require.Len(t, logs.Message(inbox.LogPartitionsCreated), 1)
	require.True(t, partitionCovers(t, pool, p))
	require.NoError(t, h.Handle(t.Context(), newMsg(t, "payments", order{OrderID: "after"}, false)))
}

// A role that may not create or attach partitions: the delivery stays
// retryable, and the store logs, once, what is wrong and what to do. It
// runs on a PostgreSQL server of its own, where the test may create the
// role. Once the owner creates the partitions (inboxctl partition), the
// retry completes.
func TestPartitionedInbox_CreationRefusedStaysRetryable(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv := pgtest.StartPrimary(t)
	owner, err := pgxpool.New(ctx, srv.URL())
	require.NoError(t, err)
	t.Cleanup(owner.Close)
	require.NoError(t, migrations.Up(ctx, owner))
	p, err := migrations.PartitionInbox(ctx, owner, &migrations.PartitionConfig{Width: time.Second, Ahead: 1})
	require.NoError(t, err)
	_, err = owner.Exec(ctx, `CREATE TABLE effects (id bigserial PRIMARY KEY, key text NOT NULL, amount int NOT NULL);
		CREATE TABLE ledger (id bigserial PRIMARY KEY, key text NOT NULL);
		CREATE ROLE worker LOGIN;
		REVOKE CREATE ON SCHEMA public FROM PUBLIC;
		GRANT USAGE ON SCHEMA public TO worker;
		GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO worker;
		GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO worker`)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(srv.URL())
	require.NoError(t, err)
	cfg.ConnConfig.User = "worker"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	waitPartitionsRunOut(t, owner, p)

	logger, logs := logtest.New(slog.LevelInfo)
	s, err := inbox.NewStore(pool, &inbox.StoreConfig{Logger: logger})
	if err == nil {
		err = s.Check(ctx)
	}
	require.NoError(t, err)
	h := inbox.Handler(s, effectHandler(nil), nil)
	msg := newMsg(t, "payments", order{OrderID: "r1", Amount: 1}, false)
	for range 3 {
		requireNoPartitionRetry(t, h.Handle(ctx, msg))
	}
	refused := logs.Message(inbox.LogPartitionsNotCreated)
	require.Len(t, refused, 1, "one line, not one per delivery")
	require.Equal(t, slog.LevelError, refused[0].Level)
	require.Contains(t, refused[0].Attrs["error"], "42501", "permission denied")
	require.Contains(t, refused[0].Attrs["fix"], "owner")
	require.Empty(t, logs.Message(inbox.LogPartitionsCreated))

	// The operator's fix: the owner tops the partitions up, and the retry
	// completes. (On a machine so slow that the new partitions ran out
	// again already, the owner tops them up once more.)
	msg.Attempt++
	for try := 0; ; try++ {
		_, err = migrations.PartitionInbox(ctx, owner, &migrations.PartitionConfig{Width: time.Second, Ahead: 1})
		require.NoError(t, err)
		err = h.Handle(ctx, msg)
		if err == nil || try == 3 {
			break
		}
		requireNoPartitionRetry(t, err)
	}
	require.NoError(t, err)
	var status string
	require.NoError(t, owner.QueryRow(ctx, `SELECT status FROM inboxmq_inbox WHERE key = 'order:r1'`).Scan(&status))
	require.Equal(t, inbox.RecordCompleted, status)
}
