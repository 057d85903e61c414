package lock_test

import (
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inboxmq/inboxmq/internal/lock"
	"github.com/inboxmq/inboxmq/internal/redistest"
)

// BenchmarkObtainRelease measures Obtain+Release pairs from 8 goroutines on
// distinct keys: two Redis round trips (EVALSHA each) per pair.
func BenchmarkObtainRelease(b *testing.B) {
	rdb, prefix := redistest.Client(b)
	ctx := b.Context()
	var n atomic.Int64
	b.SetParallelism(8 / max(1, runtimeProcs()))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		key := prefix + strconv.FormatInt(n.Add(1), 10)
		for pb.Next() {
			l, err := lock.Obtain(ctx, rdb, key, 10*time.Second, 0)
			if err != nil {
				b.Error(err)
				return
			}
			if err := l.Release(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }
