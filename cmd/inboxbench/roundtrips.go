package main

import (
	"cmp"
	"context"
	"log"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// Round trips per delivery, counted at the clients:
//
//   - PostgreSQL: a pgx tracer on the pool's ConnConfig counts one per
//     query (Exec, Query, QueryRow: BEGIN and COMMIT included) and one per
//     batch (SendBatch), whatever the number of statements in it.
//   - Redis: a go-redis hook counts one per command (Process) and one per
//     pipeline (a MULTI/EXEC transaction pipeline included).
//   - The broker: RabbitMQ's own socket counters of the bench's
//     connections (rabbitmqctl list_connections recv_cnt send_cnt: TCP
//     packets the broker received and sent), so a publish with its confirm,
//     or several acks in one packet, count as the wire sees them.

// brokerCounts is -brokercounts.
var brokerCounts = true

// benchName names every broker connection of this process, so the
// broker's counters of exactly these can be read.
var benchName = "inboxbench-" + strconv.Itoa(os.Getpid())

var (
	pgTrips    atomic.Int64
	redisTrips atomic.Int64
)

// bySQL, with -tripsql, counts the round trips per statement (a batch by
// its first one); nil otherwise.
var bySQL *sync.Map

func countSQL(sql string) {
	if bySQL == nil {
		return
	}
	sql = strings.Join(strings.Fields(sql), " ")
	if len(sql) > 90 {
		sql = sql[:90]
	}
	c, _ := bySQL.LoadOrStore(sql, new(atomic.Int64))
	if n, ok := c.(*atomic.Int64); ok {
		n.Add(1)
	}
}

// printSQLCounts prints and resets the counts of bySQL, per delivery.
func printSQLCounts(id string, n int) {
	if bySQL == nil {
		return
	}
	type kv struct {
		sql string
		n   int64
	}
	var all []kv
	bySQL.Range(func(k, v any) bool {
		sql, _ := k.(string)
		if n, ok := v.(*atomic.Int64); ok {
			all = append(all, kv{sql, n.Swap(0)})
		}
		return true
	})
	slices.SortFunc(all, func(a, b kv) int { return cmp.Compare(b.n, a.n) })
	for _, x := range all {
		if x.n > 0 {
			log.Printf("(%s) PG %.3f/delivery: %s", id, float64(x.n)/float64(n), x.sql)
		}
	}
}

// pgCounter counts PostgreSQL round trips; install it as
// ConnConfig.Tracer.
type pgCounter struct{}

var (
	_ pgx.QueryTracer = pgCounter{}
	_ pgx.BatchTracer = pgCounter{}
)

func (pgCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	pgTrips.Add(1)
	countSQL(d.SQL)
	return ctx
}

func (pgCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (pgCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	pgTrips.Add(1)
	if bySQL != nil && d.Batch != nil && len(d.Batch.QueuedQueries) > 0 {
		q := d.Batch.QueuedQueries[0].SQL
		if len(d.Batch.QueuedQueries) > 1 {
			q += " …+" + strconv.Itoa(len(d.Batch.QueuedQueries)-1)
		}
		countSQL("batch: " + q)
	}
	return ctx
}

func (pgCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (pgCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// redisCounter counts Redis round trips; add it with AddHook.
type redisCounter struct{}

func (redisCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (redisCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		redisTrips.Add(1)
		return next(ctx, cmd)
	}
}

func (redisCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		redisTrips.Add(1)
		return next(ctx, cmds)
	}
}

// brokerPackets sums recv_cnt and send_cnt over the broker's connections
// whose client-provided name starts with benchName (every connection of
// this benchmark process is named so). ok is false when rabbitmqctl is missing
// or fails (another broker than the local one, no permission): the column
// then reads "—".
func brokerPackets(ctx context.Context) (recv, send int64, ok bool) {
	if !brokerCounts {
		return 0, 0, false
	}
	out, err := exec.CommandContext(ctx, "rabbitmqctl", "-q", "list_connections", "--no-table-headers", "client_properties", "recv_cnt", "send_cnt").Output()
	if err != nil {
		return 0, 0, false
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Split(line, "\t")
		// client_properties is an Erlang term holding
		// {"connection_name","<name>"}.
		if len(f) < 3 || !strings.Contains(f[0], `"`+benchName) {
			continue
		}
		r, err1 := strconv.ParseInt(strings.TrimSpace(f[len(f)-2]), 10, 64)
		s, err2 := strconv.ParseInt(strings.TrimSpace(f[len(f)-1]), 10, 64)
		if err1 == nil && err2 == nil {
			recv += r
			send += s
		}
	}
	return recv, send, true
}
