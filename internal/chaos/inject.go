package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// Fault names, as used in Config.Faults and in the report.
const (
	// FaultKill SIGKILLs a worker and restarts it.
	FaultKill = "kill"
	// FaultRestart SIGTERMs a worker (a graceful stop) and restarts it.
	FaultRestart = "restart"
	// FaultBrokerConn closes a worker's broker connections from the server
	// side (rabbitmqctl close_connection).
	FaultBrokerConn = "broker-conn"
	// FaultPGTerminate terminates a worker's PostgreSQL backends
	// (pg_terminate_backend on its application_name).
	FaultPGTerminate = "pg-terminate"
	// FaultRedisFlush deletes every Redis key of the run (keys containing the
	// run id; never FLUSHALL).
	FaultRedisFlush = "redis-flush"
	// FaultRedisRestart kills the run's own Redis server and starts it
	// again, empty. Only with Config.RestartRedis.
	FaultRedisRestart = "redis-restart"
	// FaultPGRestart stops the run's own PostgreSQL server (a fast
	// shutdown: every session ends) and starts it again 1 to 4 seconds
	// later. Only with Config.RestartPostgres.
	FaultPGRestart = "pg-restart"
	// FaultStop SIGSTOPs a worker for longer than LOCK_TTL, then SIGCONTs it.
	FaultStop = "stop"
	// FaultGatewaySlow makes the fake gateway slow for a while.
	FaultGatewaySlow = "gateway-slow"
	// FaultGatewayFail makes the fake gateway fail part of its calls for a
	// while: some with 503 before charging, some charged but answered 500.
	FaultGatewayFail = "gateway-fail"
)

// AllFaults are the faults a run injects by default (FaultRedisRestart is
// added by Config.RestartRedis; the gateway faults only apply to scenarios
// with a gateway).
var AllFaults = []string{FaultKill, FaultRestart, FaultBrokerConn, FaultPGTerminate, FaultRedisFlush, FaultStop, FaultGatewaySlow, FaultGatewayFail}

// CloseBrokerConnections closes, from the server side, every broker
// connection of process pid: those whose client port belongs to pid (read
// from /proc) or whose connection_name ends in "-<pid>". It returns how
// many it closed; one that ended on its own after it was listed is not
// counted, and not an error.
func CloseBrokerConnections(ctx context.Context, pid int) (int, error) {
	ports, err := localPorts(pid)
	if err != nil {
		return 0, err
	}
	out, err := exec.CommandContext(ctx, "rabbitmqctl", "-q", "list_connections", "pid", "name", "client_properties").Output()
	if err != nil {
		return 0, fmt.Errorf("chaos: rabbitmqctl list_connections: %w", err)
	}
	suffix := "-" + strconv.Itoa(pid) + `"`
	var mineIDs []string
	for _, line := range strings.Split(string(out), "\n") {
		fields := strings.SplitN(line, "\t", 3)
		if len(fields) < 3 {
			continue
		}
		erlPid, name, props := fields[0], fields[1], fields[2]
		mine := strings.Contains(props, suffix)
		if client, _, ok := strings.Cut(name, " -> "); ok {
			if i := strings.LastIndexByte(client, ':'); i >= 0 {
				if p, err := strconv.Atoi(client[i+1:]); err == nil && ports[p] {
					mine = true
				}
			}
		}
		if mine {
			mineIDs = append(mineIDs, erlPid)
		}
	}
	// Each rabbitmqctl boots an Erlang VM (seconds on a loaded machine): the
	// connections are closed at once, so that one fault does not use up the
	// fault phase, and so that the worker loses them together, as it would
	// when a node goes away.
	errs := make([]error, len(mineIDs))
	closed := make([]bool, len(mineIDs))
	var wg sync.WaitGroup
	for i, id := range mineIDs {
		wg.Go(func() { closed[i], errs[i] = closeConnection(ctx, id) })
	}
	wg.Wait()
	n := 0
	for _, c := range closed {
		if c {
			n++
		}
	}
	return n, errors.Join(errs...)
}

// closeConnection closes the broker connection whose Erlang process is id.
func closeConnection(ctx context.Context, id string) (closed bool, err error) {
	cmd := exec.CommandContext(ctx, "rabbitmqctl", "-q", "close_connection", id, "inboxmq chaos: injected connection loss")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	return closeResult(cmd.Run(), stderr.String())
}

// closeResult reads how rabbitmqctl close_connection ended. A connection
// that ended on its own while the command reached it (the worker closed
// it, or reconnected: the broker answers noproc) is no failure of the
// fault, and not a connection it closed.
func closeResult(runErr error, stderr string) (closed bool, err error) {
	switch {
	case runErr == nil:
		return true, nil
	case strings.Contains(stderr, "{:noproc,"):
		return false, nil
	default:
		return false, fmt.Errorf("chaos: rabbitmqctl close_connection: %w: %s", runErr, stderr)
	}
}

// TerminateBackends terminates the PostgreSQL backends of one worker
// process: those whose application_name is appName, and those whose client
// port belongs to process pid (when pid is not 0), in case the worker sets
// its own application_name. It returns how many it terminated.
func TerminateBackends(ctx context.Context, pool *pgxpool.Pool, appName string, pid int) (int, error) {
	ports := []int32{}
	if pid != 0 {
		if m, err := localPorts(pid); err == nil {
			for p := range m {
				ports = append(ports, int32(p))
			}
		}
	}
	var n int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM (
		SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE (application_name = $1 OR (client_port = ANY($2) AND client_addr IN ('127.0.0.1', '::1')))
		  AND pid <> pg_backend_pid()) t`, appName, ports).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("chaos: terminate backends: %w", err)
	}
	return n, nil
}

// FlushRedisKeys deletes every key containing substr (SCAN + DEL, never
// FLUSHALL/FLUSHDB) and returns how many it deleted. substr must not be
// empty.
func FlushRedisKeys(ctx context.Context, rdb redis.UniversalClient, substr string) (int, error) {
	if substr == "" {
		return 0, fmt.Errorf("chaos: refusing to flush every Redis key")
	}
	n := 0
	iter := rdb.Scan(ctx, 0, "*"+substr+"*", 1000).Iterator()
	for iter.Next(ctx) {
		if err := rdb.Del(ctx, iter.Val()).Err(); err != nil {
			return n, fmt.Errorf("chaos: del: %w", err)
		}
		n++
	}
	if err := iter.Err(); err != nil {
		return n, fmt.Errorf("chaos: scan: %w", err)
	}
	return n, nil
}
