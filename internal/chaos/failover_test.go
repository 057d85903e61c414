package chaos_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/chaos"
	"github.com/inboxmq/inboxmq/internal/clustertest"
)

// failoverPortBase is the cluster's CLUSTER_PORT_BASE: apart from the
// default (25700, make cluster), from the bases internal/clustertest picks
// by itself (25800 to 26786): a cluster takes 36 ports.
const failoverPortBase = 26800

// failoverDelay is the gateway's per-call delay in TestFailover: with 3
// workers of concurrency 2 it bounds the drain to failoverRate orders a
// second, whatever the machine, so a backlog of n orders lasts at least
// n / failoverRate seconds and the fault always meets work.
const (
	failoverDelay = 250 * time.Millisecond
	failoverRate  = 3 * 2 * int(time.Second/failoverDelay)
)

// failoverScenario is one fault of TestFailover.
type failoverScenario struct {
	name string
	// orders sizes the backlog so that it outlasts the fault: failoverDelay
	// bounds the workers' throughput to failoverRate.
	orders int
	inject func(t *testing.T, ctx context.Context, run chaos.FailoverRun) (string, error)
	// check asserts what the workers' metrics must show after the fault.
	check func(t *testing.T, s *chaos.ScenarioReport)
}

// TestFailover runs the payment-worker as three processes on a real
// cluster (scripts/cluster.sh with TLS: 3 RabbitMQ nodes, a PostgreSQL
// primary with a streaming standby, Redis behind 3 Sentinels), each
// draining a backlog of orders on a quorum queue in claim mode (the
// recording gateway counts the charges), an order's duplicate copies side
// by side. Each failover subtest breaks one server mid-drain and then
// judges the run as the contract does: one payment, one ledger entry and
// one charge per order, nothing lost, nothing left in the work and retry
// queues, nothing unexpected in the DLQ. It logs how long consumption
// stopped and what the workers' metrics counted (docs/deployment.md has
// the figures).
//
// The workers reach every server over TLS with the cluster's throwaway CA:
// amqps:// to the brokers, sslmode=verify-full to PostgreSQL with the
// standby listed first (so both servers' certificates are verified:
// target_session_attrs=read-write moves on from the standby), and
// rediss+sentinel:// to Redis. The first subtests give them a CA that
// signed none of the servers' certificates: a worker must then refuse to
// start, naming the service. No worker log line may carry a password or
// certificate material.
//
// The subtests share one cluster and run one after another. The node the
// leader kill takes down stays down (the later scenarios run on two of
// three nodes, as a cluster waiting for a node's repair does), and the
// standby's promotion comes last, since it leaves no standby.
//
//nolint:paralleltest // one cluster for the scenarios, one after another: the stall figures need the machine
func TestFailover(t *testing.T) {
	c := clustertest.Start(t, &clustertest.Options{TLS: true, PortBase: failoverPortBase})
	require.NotEmpty(t, c.AMQPSURLs)
	require.NotEmpty(t, c.DatabaseTLSURL)
	require.NotEmpty(t, c.RedisTLSURL)
	require.NotEmpty(t, c.CAFile)
	// The runner's own Redis client reaches the Sentinels over TLS too:
	// crypto/tls reads the roots from SSL_CERT_FILE on first use, and
	// nothing in this process used them before (the other tests of the
	// package that could run in parallel wait for this one).
	t.Setenv("SSL_CERT_FILE", c.CAFile)
	ca, err := os.ReadFile(c.CAFile)
	require.NoError(t, err)
	tc := &tlsCluster{Cluster: c, bin: buildWorker(t), ca: ca, dbURL: standbyFirst(t, c)}

	wrongCA := writeCA(t)
	t.Run("wrong-ca-rabbitmq", func(t *testing.T) {
		logs := tc.refused(t, tc.dbURL, wrongCA)
		require.Contains(t, logs, "RabbitMQ")
	})
	t.Run("wrong-ca-postgresql", func(t *testing.T) {
		wrongDB := strings.Replace(tc.dbURL, "sslrootcert="+c.CAFile, "sslrootcert="+wrongCA, 1)
		require.NotEqual(t, tc.dbURL, wrongDB)
		logs := tc.refused(t, wrongDB, c.CAFile)
		require.Contains(t, logs, "PostgreSQL")
	})

	scenarios := []failoverScenario{{
		name: "rolling-broker-restart",
		// Three node restarts take 40–80s on a loaded 2-core machine.
		orders: 90 * failoverRate,
		inject: func(t *testing.T, _ context.Context, _ chaos.FailoverRun) (string, error) {
			var took []string
			for i := 1; i <= len(c.RabbitNodes); i++ {
				start := time.Now()
				c.RestartRabbit(t, i)
				took = append(took, fmt.Sprintf("node %d %s", i, time.Since(start).Round(100*time.Millisecond)))
			}
			return "restarted each node in turn: " + strings.Join(took, ", "), nil
		},
		check: reconnected,
	}, {
		name:   "kill-queue-leader",
		orders: 20 * failoverRate,
		inject: func(t *testing.T, _ context.Context, run chaos.FailoverRun) (string, error) {
			killed := c.QueueLeader(t, "/", run.Queue)
			c.KillRabbit(t, killed)
			return fmt.Sprintf("SIGKILLed node %d, the work queue's leader", killed), nil
		},
		check: func(t *testing.T, s *chaos.ScenarioReport) {
			t.Helper()
			reconnected(t, s)
			// The duplicate copies deferred behind their key's lock were
			// in flight as retries when the leader died: each went out
			// on time, none waited for the broker's dead-letter hop.
			require.Positive(t, s.Retries, "no retry was scheduled in the outbox")
			require.Zero(t, s.RetriesLate, "retries published more than %s after their due time (the latest %s)", chaos.RetryLateBound, s.RetryLateMax)
		},
	}, {
		name:   "redis-sentinel-failover",
		orders: 20 * failoverRate,
		inject: func(t *testing.T, ctx context.Context, run chaos.FailoverRun) (string, error) {
			held, err := lockKeys(ctx, run)
			if err != nil {
				return "", err
			}
			c.RedisFailover(t)
			kept, err := lockKeys(ctx, run)
			if err != nil {
				return "", err
			}
			survived := 0
			for k := range held {
				if kept[k] {
					survived++
				}
			}
			// The worst a failover can do to the locks: lose every one
			// while its holder is still working. The inbox and the fence
			// must still allow one effect per order.
			lost, err := deleteKeys(ctx, run, kept)
			if err != nil {
				return "", err
			}
			// Locks held by workers still running were lost: the case
			// under test did happen.
			require.Positive(t, lost, "no lock was held when Redis failed over")
			return fmt.Sprintf("master moved; %d of %d locks held at the failover survived it; then %d lock keys deleted (every lock lost)",
				survived, len(held), lost), nil
		},
	}, {
		name:   "promote-postgres-standby",
		orders: 20 * failoverRate,
		inject: func(t *testing.T, _ context.Context, _ chaos.FailoverRun) (string, error) {
			c.PromoteStandby(t)
			return "fenced the primary (fast stop) and promoted the standby", nil
		},
		check: func(t *testing.T, s *chaos.ScenarioReport) {
			t.Helper()
			require.Positive(t, sumDeltas(s, "retry_total", `reason="db_`),
				"transactions cut by the failover were retried with a database reason")
		},
	}}

	for _, sc := range scenarios {
		ok := t.Run(sc.name, func(t *testing.T) {
			s := tc.failover(t, sc)
			if sc.check != nil {
				sc.check(t, s)
			}
		})
		require.True(t, ok, "scenario %s failed: the next ones would start on a broken cluster", sc.name)
	}
}

// tlsCluster is TestFailover's cluster with what every run needs.
type tlsCluster struct {
	*clustertest.Cluster
	bin   string // the payment-worker
	ca    []byte // the cluster's CA, which no log line may show
	dbURL string // the workers' DATABASE_URL: TLS, standby first, pgSecret
}

// config is a run of n orders whose workers reach the cluster over TLS
// with dbURL and the roots in certFile; the runner uses plain connections
// where it can.
func (c *tlsCluster) config(t *testing.T, n int, dbURL, certFile string, log *bytes.Buffer) *chaos.Config {
	t.Helper()
	return &chaos.Config{
		Seed:              20261203,
		Orders:            n,
		Workers:           3,
		Concurrency:       2,
		Duration:          time.Second,
		DrainTimeout:      3 * time.Minute,
		Scenarios:         []string{chaos.ScenarioGateway},
		GatewayDelay:      failoverDelay,
		Lock:              "on", // redis-sentinel-failover needs locks to lose
		QueueType:         "quorum",
		Binary:            c.bin,
		WorkDir:           t.TempDir(),
		AMQPURL:           strings.Join(c.AMQPURLs, ","),
		DatabaseURL:       c.DatabaseURL,
		RedisURL:          c.RedisTLSURL,
		WorkerAMQPURL:     strings.Join(c.AMQPSURLs, ","),
		WorkerDatabaseURL: dbURL,
		WorkerRedisURL:    c.RedisTLSURL,
		// Go's crypto/tls reads the roots of amqps:// and rediss:// from
		// SSL_CERT_FILE; pgx takes sslrootcert= in the URL.
		WorkerEnv: []string{"SSL_CERT_FILE=" + certFile, "CONNECT_TIMEOUT=5s"},
		Log:       log,
	}
}

// refused runs workers that cannot verify a server's certificate: they
// must not start, and their logs must say why. It returns the logs.
func (c *tlsCluster) refused(t *testing.T, dbURL, certFile string) string {
	t.Helper()
	var log bytes.Buffer
	cfg := c.config(t, 10, dbURL, certFile, &log)
	cfg.Workers = 1
	_, err := chaos.Run(t.Context(), cfg)
	logs := workerLogs(t, cfg.WorkDir)
	t.Log("\n" + log.String() + logs)
	require.Error(t, err, "a worker that cannot verify a server's certificate must not start")
	require.Contains(t, logs, "certificate signed by unknown authority")
	assertNoSecrets(t, logs, c.ca)
	return logs
}

// failover runs one scenario over TLS and checks the contract.
func (c *tlsCluster) failover(t *testing.T, sc failoverScenario) *chaos.ScenarioReport {
	t.Helper()
	var log, table bytes.Buffer
	// Logged also when an Inject fails the test midway.
	defer func() { t.Log("\n" + log.String() + table.String()) }()
	cfg := c.config(t, sc.orders, c.dbURL, c.CAFile, &log)
	cfg.Failover = &chaos.Failover{Name: sc.name, After: 0.1, Inject: func(ctx context.Context, run chaos.FailoverRun) (string, error) {
		return sc.inject(t, ctx, run)
	}}
	rep, err := chaos.Run(t.Context(), cfg)
	if rep != nil {
		rep.WriteTable(&table)
	}
	require.NoError(t, err)
	require.True(t, rep.OK(), "guarantees broken across %s", sc.name)
	require.Len(t, rep.Scenarios, 1)
	s := rep.Scenarios[0]
	require.NotNil(t, s.Check)
	require.Equal(t, sc.orders, s.Check.Payments)
	require.Equal(t, sc.orders, s.Check.LedgerEntries)
	require.Equal(t, sc.orders, s.Check.ChargesCreated)
	require.Len(t, s.Faults, 1)
	f := s.Faults[0]
	require.Empty(t, f.Err)
	assertNoSecrets(t, workerLogs(t, cfg.WorkDir), c.ca)
	// The fault hit a running drain.
	require.Greater(t, f.Pending, sc.orders/2, "the fault began with most of the backlog left")
	if f.RateAfter == 0 {
		t.Logf("%s outlasted the backlog: its stall covers only the part with work left (a slow machine: raise orders)", sc.name)
	}
	return s
}

// reconnected checks that connections on the nodes that went away were
// made again (to another node, or to the same one back up).
func reconnected(t *testing.T, s *chaos.ScenarioReport) {
	t.Helper()
	require.Positive(t, s.MetricDelta("broker_connections_total"), "no broker connection was made again")
}

// sumDeltas sums the growth of the series whose name ends in suffix and
// whose labels contain label.
func sumDeltas(s *chaos.ScenarioReport, suffix, label string) float64 {
	var d float64
	for k, v := range s.SeriesAfter {
		name, labels, _ := strings.Cut(k, "{")
		if strings.HasSuffix(name, suffix) && strings.Contains(labels, label) {
			d += v - s.SeriesBefore[k]
		}
	}
	return d
}

// buildWorker builds the payment-worker once for the scenarios.
func buildWorker(t *testing.T) string {
	t.Helper()
	root, err := chaos.RepoRoot()
	require.NoError(t, err)
	bin, err := chaos.BuildWorker(t.Context(), root, t.TempDir())
	require.NoError(t, err)
	return bin
}

// lockKeys returns the run's Redis lock keys.
func lockKeys(ctx context.Context, run chaos.FailoverRun) (map[string]bool, error) {
	keys := make(map[string]bool)
	iter := run.Redis.Scan(ctx, 0, "*lock*"+run.RunID+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys[iter.Val()] = true
	}
	if err := iter.Err(); err != nil {
		return nil, fmt.Errorf("scan lock keys: %w", err)
	}
	return keys, nil
}

// deleteKeys deletes keys and returns how many existed.
func deleteKeys(ctx context.Context, run chaos.FailoverRun, keys map[string]bool) (int64, error) {
	var n int64
	for k := range keys {
		d, err := run.Redis.Del(ctx, k).Result()
		if err != nil {
			return n, fmt.Errorf("delete %s: %w", k, err)
		}
		n += d
	}
	return n, nil
}

// pgSecret is a password put into the workers' DATABASE_URL (the cluster's
// PostgreSQL trusts loopback, so it is never checked): it must never show
// in a log line.
const pgSecret = "s3cret-pg-tls"

// standbyFirst returns the cluster's TLS database URL with the password
// pgSecret and the standby listed before the primary, so that a connection
// verifies the standby's certificate before it moves on to the primary.
func standbyFirst(t *testing.T, c *clustertest.Cluster) string {
	t.Helper()
	u := c.DatabaseTLSURL
	at := strings.Index(u, "@")
	slash := strings.Index(u[at:], "/") + at
	hosts := strings.Split(u[at+1:slash], ",")
	require.Len(t, hosts, 2, "a primary and a standby in %s", u)
	return strings.Replace(u[:at], "postgres://postgres", "postgres://postgres:"+pgSecret, 1) +
		"@" + hosts[1] + "," + hosts[0] + u[slash:]
}

// workerLogs returns every worker log under dir.
func workerLogs(t *testing.T, dir string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*", "worker-*.log"))
	require.NoError(t, err)
	require.NotEmpty(t, files, "the workers wrote no log under %s", dir)
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		b.WriteString("---- " + filepath.Base(f) + "\n")
		b.Write(data)
	}
	return b.String()
}

// assertNoSecrets fails if a log line carries a password or certificate
// material.
func assertNoSecrets(t *testing.T, logs string, ca []byte) {
	t.Helper()
	require.NotContains(t, logs, pgSecret, "a database password in a log line")
	require.NotContains(t, logs, "guest:guest", "a broker password in a log line")
	require.NotContains(t, logs, "-----BEGIN", "certificate or key material in a log line")
	block, _ := pem.Decode(ca)
	require.NotNil(t, block)
	body := strings.ReplaceAll(string(ca), "\n", "")
	for i := 30; i+32 < len(body)-30; i += 200 {
		require.NotContains(t, logs, body[i:i+32], "certificate material in a log line")
	}
}

// writeCA writes a throwaway CA that signed none of the cluster's
// certificates and returns its path.
func writeCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "inboxmq wrong test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "wrong-ca.pem")
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	return path
}
