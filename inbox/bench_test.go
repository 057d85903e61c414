package inbox_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
)

// countingTracer counts the round trips on a pool: each statement sent on
// its own, and each pgx.Batch once.
type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *countingTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *countingTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *countingTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// benchSetup returns a bundle whose pool counts its round trips.
func benchSetup(b *testing.B) (*testBundle, *countingTracer) {
	b.Helper()
	tr := &countingTracer{}
	return setupOn(b, tracedPool(b, tr), nil), tr
}

var benchSeq atomic.Int64

func benchMsg(b *testing.B) *inboxtype.Message[order] {
	return newMsg(b, "bench", order{OrderID: strconv.FormatInt(benchSeq.Add(1), 10), Amount: 1}, false)
}

func report(b *testing.B, start time.Time, tr *countingTracer, before int64) {
	b.Helper()
	el := time.Since(start).Seconds()
	b.ReportMetric(float64(b.N)/el, "msgs/s")
	b.ReportMetric(float64(tr.n.Load()-before)/float64(b.N), "roundtrips/msg")
}

// handWritten is the same work as the inbox handler written directly with
// pgx: one transaction per message.
func handWritten(ctx context.Context, pool *pgxpool.Pool, msg *inboxtype.Message[order]) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var k string
	err = tx.QueryRow(ctx, `INSERT INTO inboxmq_inbox (consumer, key, status, completed_at) VALUES ($1, $2, 'completed', now())
		ON CONFLICT DO NOTHING RETURNING key`, msg.Namespace, msg.Key).Scan(&k)
	if err != nil {
		return err
	}
	if err := effectHandler(nil)(ctx, tx, msg); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// parallel8 runs fn b.N times from 8 goroutines.
func parallel(b *testing.B, goroutines int, fn func(msg *inboxtype.Message[order]) error) {
	b.Helper()
	b.SetParallelism(max(goroutines/runtime.GOMAXPROCS(0), 1))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := fn(benchMsg(b)); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkPerMessage compares the inbox's per-message mode with the same
// work (inbox insert and two business inserts, one transaction per message)
// hand-written with pgx, from 8 goroutines.
func BenchmarkPerMessage(b *testing.B) {
	b.Run("inbox", func(b *testing.B) {
		tb, tr := benchSetup(b)
		h := inbox.Handler(tb.store, effectHandler(nil), nil)
		b.ReportAllocs()
		b.ResetTimer()
		before, start := tr.n.Load(), time.Now()
		parallel(b, 8, func(msg *inboxtype.Message[order]) error { return h.Handle(b.Context(), msg) })
		report(b, start, tr, before)
	})
	b.Run("handwritten", func(b *testing.B) {
		tb, tr := benchSetup(b)
		b.ReportAllocs()
		b.ResetTimer()
		before, start := tr.n.Load(), time.Now()
		parallel(b, 8, func(msg *inboxtype.Message[order]) error { return handWritten(b.Context(), tb.pool, msg) })
		report(b, start, tr, before)
	})
}

// handWrittenBatch is a hand-written group commit: one transaction, one
// multi-row inbox insert, the business inserts of every message, one
// COMMIT (no savepoints: one failure would fail the batch).
func handWrittenBatch(ctx context.Context, pool *pgxpool.Pool, msgs []*inboxtype.Message[order]) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	keys := make([]string, len(msgs))
	for i, m := range msgs {
		keys[i] = m.Key
	}
	if _, err := tx.Exec(ctx, `INSERT INTO inboxmq_inbox (consumer, key, status, completed_at)
		SELECT 'bench', k, 'completed', now() FROM unnest($1::text[]) AS k ORDER BY k ON CONFLICT DO NOTHING`, keys); err != nil {
		return err
	}
	for _, m := range msgs {
		if err := effectHandler(nil)(ctx, tx, m); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// BenchmarkGroupCommit compares the inbox's group commit (batches of up to
// 64, 128 concurrent deliveries, 2 batches in flight) with a hand-written
// batched loop (2 workers, 64 messages per transaction).
func BenchmarkGroupCommit(b *testing.B) {
	b.Run("inbox", func(b *testing.B) {
		tb, tr := benchSetup(b)
		h := inbox.Handler(tb.store, effectHandler(nil), &inbox.GroupCommit{MaxBatch: 64, MaxWait: 2 * time.Millisecond, MaxInFlight: 2})
		b.ReportAllocs()
		b.ResetTimer()
		before, start := tr.n.Load(), time.Now()
		parallel(b, 128, func(msg *inboxtype.Message[order]) error { return h.Handle(b.Context(), msg) })
		report(b, start, tr, before)
	})
	b.Run("handwritten", func(b *testing.B) {
		tb, tr := benchSetup(b)
		msgs := make(chan *inboxtype.Message[order], 1024)
		go func() {
			defer close(msgs)
			for range b.N {
				msgs <- benchMsg(b)
			}
		}()
		b.ReportAllocs()
		b.ResetTimer()
		before, start := tr.n.Load(), time.Now()
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				batch := make([]*inboxtype.Message[order], 0, 64)
				flush := func() {
					if len(batch) > 0 {
						if err := handWrittenBatch(b.Context(), tb.pool, batch); err != nil {
							b.Error(err)
						}
						batch = batch[:0]
					}
				}
				for m := range msgs {
					batch = append(batch, m)
					if len(batch) == cap(batch) {
						flush()
					}
				}
				flush()
			})
		}
		wg.Wait()
		report(b, start, tr, before)
	})
}

// BenchmarkClaim is claim mode completing with one effect row
// (completeWithEffect): 3 round trips per message when claims do not
// coincide (the claim; BEGIN with the fenced completion and the insert;
// COMMIT), fewer with more concurrent handlers, whose claims share
// statements.
func BenchmarkClaim(b *testing.B) {
	for _, workers := range []int{2, 8, 32} {
		b.Run("handlers="+strconv.Itoa(workers), func(b *testing.B) {
			tb, tr := benchSetup(b)
			h := completingClaimHandler(tb, nil, nil)
			b.ReportAllocs()
			b.ResetTimer()
			before, start := tr.n.Load(), time.Now()
			parallel(b, workers, func(msg *inboxtype.Message[order]) error { return h.Handle(b.Context(), msg) })
			report(b, start, tr, before)
		})
	}
}

// BenchmarkClaimGroupCommit is BenchmarkClaim with group-committed
// completions (ClaimHandler with a GroupCommit).
func BenchmarkClaimGroupCommit(b *testing.B) {
	for _, workers := range []int{8, 32, 128} {
		b.Run(fmt.Sprintf("handlers=%d", workers), func(b *testing.B) {
			tb, tr := benchSetup(b)
			h := completingClaimHandler(tb, &inbox.GroupCommit{
				MaxBatch: 64, MaxWait: 2 * time.Millisecond, MaxInFlight: 2,
			}, nil)
			b.ReportAllocs()
			b.ResetTimer()
			before, start := tr.n.Load(), time.Now()
			parallel(b, workers, func(msg *inboxtype.Message[order]) error { return h.Handle(b.Context(), msg) })
			report(b, start, tr, before)
		})
	}
}
