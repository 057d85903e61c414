//go:build unix

package clustertest_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/clustertest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/internal/topolint"
)

// TestCluster starts one cluster with TLS and proves each part of it real:
// TLS with the right CA and not with a wrong one, then, in parallel, a
// RabbitMQ node loss and restart, a PostgreSQL promotion and a Redis
// failover.
//
//nolint:tparallel // the TLS group must end before the failovers change which servers run
func TestCluster(t *testing.T) {
	t.Parallel()
	if testing.Short() && !testenv.CI() {
		t.Skip("starts a RabbitMQ cluster, PostgreSQL with a standby and Redis with Sentinels: run without -short")
	}
	// CLUSTERTEST_TLS=0 runs the failovers on a cluster without TLS, the
	// way make cluster starts it (Redis then fails over through the plain
	// Sentinel URL); CI runs the default, with TLS.
	withTLS := os.Getenv("CLUSTERTEST_TLS") != "0"
	c := clustertest.Start(t, &clustertest.Options{TLS: withTLS})

	// TLS first: the failover subtests below change which servers run.
	if withTLS {
		t.Run("TLS", func(t *testing.T) {
			t.Run("AMQPS", func(t *testing.T) { t.Parallel(); testAMQPS(t, c) })
			t.Run("PostgreSQL", func(t *testing.T) { t.Parallel(); testPostgresTLS(t, c) })
			t.Run("Redis", func(t *testing.T) { t.Parallel(); testRedisTLS(t, c) })
		})
	}
	// Before the failovers too: the lint reads node 1.
	t.Run("Management", func(t *testing.T) {
		t.Run("Lint", func(t *testing.T) { t.Parallel(); testLint(t, c) })
	})
	t.Run("Failover", func(t *testing.T) {
		t.Run("RabbitMQ", func(t *testing.T) { t.Parallel(); testRabbitMQ(t, c) })
		t.Run("PostgreSQL", func(t *testing.T) { t.Parallel(); testPostgres(t, c) })
		t.Run("Redis", func(t *testing.T) { t.Parallel(); testRedis(t, c) })
	})
}

// --- RabbitMQ -------------------------------------------------------------

func testRabbitMQ(t *testing.T, c *clustertest.Cluster) {
	for i := 1; i <= 3; i++ {
		require.ElementsMatch(t, c.RabbitNodes, runningNodes(t, c, i), "node %d's view of the cluster", i)
	}

	queue := "clustertest.quorum." + randomHex(t)
	conn1 := dialAMQP(t, c.AMQPURLs[0])
	ch, err := conn1.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	require.NoError(t, err)
	require.NoError(t, ch.Close())
	q := queueInfo(t, c, 1, queue)
	require.Equal(t, "quorum", q.Type)
	require.ElementsMatch(t, c.RabbitNodes, q.Members, "a quorum queue declared through node 1 has a member on each node")

	publish(t, conn1, queue, "through node 1")
	require.Equal(t, "through node 1", get(t, dialAMQP(t, c.AMQPURLs[2]), queue), "consumed through node 3")

	// Lose the leader: a message confirmed before must still be delivered,
	// by a new leader.
	leader := c.QueueLeader(t, "/", queue)
	other := leader%3 + 1
	publish(t, dialAMQP(t, c.AMQPURLs[other-1]), queue, "before the kill")
	c.KillRabbit(t, leader)
	var newLeader int
	testenv.WaitFor(t, "a new leader of "+queue, func() bool {
		newLeader = c.QueueLeader(t, "/", queue)
		return newLeader != leader
	})
	third := 6 - leader - newLeader
	require.Equal(t, "before the kill", get(t, dialAMQP(t, c.AMQPURLs[third-1]), queue))
	publish(t, dialAMQP(t, c.AMQPURLs[newLeader-1]), queue, "after the kill")
	require.Equal(t, "after the kill", get(t, dialAMQP(t, c.AMQPURLs[third-1]), queue))

	// The killed node comes back into the cluster and the queue.
	c.StartRabbit(t, leader)
	require.ElementsMatch(t, c.RabbitNodes, runningNodes(t, c, leader))
	testenv.WaitFor(t, "every member of "+queue+" online again", func() bool {
		return len(queueInfo(t, c, leader, queue).Online) == 3
	})

	// A graceful restart of the current leader hands the queue over too.
	publish(t, dialAMQP(t, c.AMQPURLs[leader-1]), queue, "before the restart")
	c.RestartRabbit(t, newLeader)
	require.ElementsMatch(t, c.RabbitNodes, runningNodes(t, c, newLeader), "the restarted node rejoined")
	require.NotEqual(t, newLeader, c.QueueLeader(t, "/", queue), "a stopped leader hands leadership over")
	require.Equal(t, "before the restart", get(t, dialAMQP(t, c.AMQPURLs[newLeader-1]), queue), "consumed through the restarted node")
}

func runningNodes(t *testing.T, c *clustertest.Cluster, i int) []string {
	t.Helper()
	var status struct {
		RunningNodes []string `json:"running_nodes"`
	}
	out := c.Rabbitmqctl(t, i, "cluster_status", "--formatter", "json")
	require.NoError(t, json.Unmarshal([]byte(out), &status), out)
	return status.RunningNodes
}

type queueRow struct {
	Name    string   `json:"name"`
	Type    string   `json:"type"`
	Leader  string   `json:"leader"`
	Members []string `json:"members"`
	Online  []string `json:"online"`
}

func queueInfo(t *testing.T, c *clustertest.Cluster, node int, queue string) queueRow {
	t.Helper()
	out := c.Rabbitmqctl(t, node, "list_queues", "-p", "/", "name", "type", "leader", "members", "online", "--formatter", "json")
	var rows []queueRow
	require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
	for _, r := range rows {
		if r.Name == queue {
			return r
		}
	}
	t.Fatalf("queue %s not listed by node %d:\n%s", queue, node, out)
	return queueRow{}
}

func dialAMQP(t *testing.T, url string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(url, amqp.Config{Heartbeat: 5 * time.Second, Dial: amqp.DefaultDial(10 * time.Second)})
	require.NoError(t, err, url)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// publish sends body to queue and waits for the broker's confirm.
func publish(t *testing.T, conn *amqp.Connection, queue, body string) {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	require.NoError(t, ch.Confirm(false))
	ctx, cancel := context.WithTimeout(t.Context(), testenv.Timeout())
	defer cancel()
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent,
		Body:         []byte(body),
	})
	require.NoError(t, err)
	acked, err := conf.WaitContext(ctx)
	require.NoError(t, err)
	require.True(t, acked, "the broker confirms %q", body)
}

// get takes one message from queue (polling, bounded), acks it and returns
// its body.
func get(t *testing.T, conn *amqp.Connection, queue string) string {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	var body string
	testenv.WaitFor(t, "a message in "+queue, func() bool {
		d, ok, err := ch.Get(queue, false)
		require.NoError(t, err)
		if !ok {
			return false
		}
		require.NoError(t, d.Ack(false))
		body = string(d.Body)
		return true
	})
	return body
}

// --- PostgreSQL -----------------------------------------------------------

func testPostgres(t *testing.T, c *clustertest.Cluster) {
	ctx := t.Context()
	primaryPort, standbyPort := pgPort(t, c.PrimaryURL), pgPort(t, c.StandbyURL)

	primary := connectPG(t, c.PrimaryURL)
	_, err := primary.Exec(ctx, `CREATE TABLE clustertest_rows (id int PRIMARY KEY, note text NOT NULL)`)
	require.NoError(t, err)
	_, err = primary.Exec(ctx, `INSERT INTO clustertest_rows VALUES (1, 'written on the primary')`)
	require.NoError(t, err)

	standby := connectPG(t, c.StandbyURL)
	testenv.WaitFor(t, "the standby replays the row", func() bool {
		var n int
		err := standby.QueryRow(ctx, `SELECT count(*) FROM clustertest_rows WHERE id = 1`).Scan(&n)
		return err == nil && n == 1
	})
	_, err = standby.Exec(ctx, `INSERT INTO clustertest_rows VALUES (2, 'on a standby')`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "25006", pgErr.Code, "a standby refuses writes (read_only_sql_transaction)")

	require.Equal(t, primaryPort, serverPort(t, connectPG(t, c.DatabaseURL)), "read-write lands on the primary")

	c.PromoteStandby(t)

	_, err = pgx.Connect(ctx, c.PrimaryURL)
	require.Error(t, err, "the old primary is fenced")
	pool, err := pgxpool.New(ctx, c.DatabaseURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var port int
	require.NoError(t, pool.QueryRow(ctx, `SELECT inet_server_port()`).Scan(&port))
	require.Equal(t, standbyPort, port, "read-write lands on the promoted standby")
	_, err = pool.Exec(ctx, `INSERT INTO clustertest_rows VALUES (2, 'written on the promoted standby')`)
	require.NoError(t, err)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM clustertest_rows`).Scan(&n))
	require.Equal(t, 2, n, "the row written before the promotion is there")
}

func connectPG(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func serverPort(t *testing.T, conn *pgx.Conn) int {
	t.Helper()
	var port int
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT inet_server_port()`).Scan(&port))
	return port
}

func pgPort(t *testing.T, url string) int {
	t.Helper()
	cfg, err := pgconn.ParseConfig(url)
	require.NoError(t, err)
	return int(cfg.Port)
}

// --- Redis ----------------------------------------------------------------

// testRedis fails the master over through the Sentinels. With TLS the
// Sentinels name TLS ports, so it goes through RedisTLSURL then.
func testRedis(t *testing.T, c *clustertest.Cluster) {
	ctx := t.Context()
	var tlsConf *tls.Config
	sentinels := sentinelAddrs(t, c.RedisURL)
	if c.CAFile != "" {
		tlsConf = &tls.Config{RootCAs: caPool(t, c.CAFile), MinVersion: tls.VersionTLS12}
		sentinels = sentinelAddrs(t, c.RedisTLSURL)
	}

	sentinel := redis.NewSentinelClient(&redis.Options{Addr: sentinels[0], TLSConfig: tlsConf})
	t.Cleanup(func() { _ = sentinel.Close() })
	oldMaster := masterAddr(t, sentinel)
	replicas, err := sentinel.Replicas(ctx, "mymaster").Result()
	require.NoError(t, err)
	require.Len(t, replicas, 1)
	replica := net.JoinHostPort(replicas[0]["ip"], replicas[0]["port"])

	client := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: sentinels, TLSConfig: tlsConf})
	t.Cleanup(func() { _ = client.Close() })
	key := "clustertest:" + randomHex(t)
	require.NoError(t, client.Set(ctx, key, "survives", 0).Err())
	n, err := client.Wait(ctx, 1, 5*time.Second).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "the replica has the key before the failover")

	c.RedisFailover(t)

	require.Equal(t, replica, masterAddr(t, sentinel), "the old replica is the master")
	require.NotEqual(t, oldMaster, replica)
	newMaster := redis.NewClient(&redis.Options{Addr: replica, TLSConfig: tlsConf})
	t.Cleanup(func() { _ = newMaster.Close() })
	require.Equal(t, "survives", newMaster.Get(ctx, key).Val())
	// The Sentinel-discovered client follows: its writes reach the new master.
	testenv.WaitFor(t, "a write through the failover client", func() bool {
		return client.Set(ctx, key+":after", "x", 0).Err() == nil
	})
	require.Equal(t, "x", newMaster.Get(ctx, key+":after").Val())
	require.Equal(t, "survives", client.Get(ctx, key).Val())
}

func masterAddr(t *testing.T, s *redis.SentinelClient) string {
	t.Helper()
	addr, err := s.GetMasterAddrByName(t.Context(), "mymaster").Result()
	require.NoError(t, err)
	require.Len(t, addr, 2)
	return net.JoinHostPort(addr[0], addr[1])
}

// sentinelAddrs returns the host:port list of a redis(s)+sentinel URL.
func sentinelAddrs(t *testing.T, raw string) []string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	require.Equal(t, "/mymaster", u.Path)
	return strings.Split(u.Host, ",")
}

// --- TLS ------------------------------------------------------------------

func testAMQPS(t *testing.T, c *clustertest.Cluster) {
	require.Len(t, c.AMQPSURLs, 3)
	good, wrong := caPool(t, c.CAFile), wrongCA(t)
	for _, u := range c.AMQPSURLs {
		conn, err := amqp.DialTLS(u, &tls.Config{RootCAs: good, MinVersion: tls.VersionTLS12})
		require.NoError(t, err, u)
		require.True(t, conn.ConnectionState().HandshakeComplete)
		require.NoError(t, conn.Close())
	}
	_, err := amqp.DialTLS(c.AMQPSURLs[0], &tls.Config{RootCAs: wrong.pool, MinVersion: tls.VersionTLS12})
	requireUnknownAuthority(t, err)
}

func testPostgresTLS(t *testing.T, c *clustertest.Cluster) {
	require.Contains(t, c.DatabaseTLSURL, "sslmode=verify-full")
	ctx := t.Context()
	for _, attrs := range []string{"read-write", "standby"} {
		url := strings.Replace(c.DatabaseTLSURL, "target_session_attrs=read-write", "target_session_attrs="+attrs, 1)
		conn := connectPG(t, url)
		var ssl bool
		require.NoError(t, conn.QueryRow(ctx, `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl))
		require.True(t, ssl, attrs)
	}
	wrongURL := strings.Replace(c.DatabaseTLSURL, "sslrootcert="+c.CAFile, "sslrootcert="+wrongCA(t).file, 1)
	require.NotEqual(t, c.DatabaseTLSURL, wrongURL)
	_, err := pgx.Connect(ctx, wrongURL)
	requireUnknownAuthority(t, err)
}

func testRedisTLS(t *testing.T, c *clustertest.Cluster) {
	ctx := t.Context()
	sentinels := sentinelAddrs(t, c.RedisTLSURL)
	good := &tls.Config{RootCAs: caPool(t, c.CAFile), MinVersion: tls.VersionTLS12}
	for _, addr := range sentinels {
		s := redis.NewSentinelClient(&redis.Options{Addr: addr, TLSConfig: good})
		require.NoError(t, s.Ping(ctx).Err(), addr)
		require.NoError(t, s.Close())
	}
	client := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: sentinels, TLSConfig: good})
	require.NoError(t, client.Ping(ctx).Err(), "rediss through the Sentinels")
	require.NoError(t, client.Close())

	bad := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: "mymaster", SentinelAddrs: sentinels, MaxRetries: -1,
		TLSConfig: &tls.Config{RootCAs: wrongCA(t).pool, MinVersion: tls.VersionTLS12},
	})
	defer bad.Close()
	requireUnknownAuthority(t, bad.Ping(ctx).Err())
}

func requireUnknownAuthority(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		// Some clients flatten the TLS error into their own text.
		require.Contains(t, err.Error(), "certificate signed by unknown authority")
	}
}

func caPool(t *testing.T, file string) *x509.CertPool {
	t.Helper()
	require.NotEmpty(t, file, "the cluster runs with TLS")
	pemBytes, err := os.ReadFile(file)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(pemBytes), file)
	return pool
}

type ca struct {
	pool *x509.CertPool
	file string
}

// wrongCA makes a CA that signed none of the cluster's certificates.
func wrongCA(t *testing.T) ca {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "clustertest wrong CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "wrong-ca.pem")
	require.NoError(t, os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	return ca{pool: caPool(t, file), file: file}
}

func randomHex(t *testing.T) string {
	t.Helper()
	var b [6]byte
	_, err := rand.Read(b[:])
	require.NoError(t, err)
	return hex.EncodeToString(b[:]) + strconv.FormatInt(time.Now().UnixNano()%1000, 10)
}

// --- topology lint ----------------------------------------------------------

// The topology lint reads a node's management API: a quorum queue as the
// worker declares it has no finding; one declared with a delivery limit
// below the route's attempts, and a classic queue under a policy that
// expires messages with no dead-letter target, are errors.
func testLint(t *testing.T, c *clustertest.Cluster) {
	conn := dialAMQP(t, c.AMQPURLs[0])
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	work := func(limit int64) amqp.Table {
		return amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "lint.dead",
			"x-delivery-limit": limit, "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
	}
	for name, args := range map[string]amqp.Table{"lint.ok": work(20), "lint.low": work(3), "lint.ttl": {"x-queue-type": "classic"}} {
		_, err := ch.QueueDeclare(name, true, false, false, false, args)
		require.NoError(t, err, name)
		defer func() { _, _ = ch.QueueDelete(name, false, false, false) }() // the failover tests list every queue
	}
	c.Rabbitmqctl(t, 1, "set_policy", "lint-ttl", `^lint\.ttl$`, `{"message-ttl":60000}`, "--apply-to", "queues")
	defer c.Rabbitmqctl(t, 1, "clear_policy", "lint-ttl")

	declared := map[string]any(work(20))
	route := func(name string) topolint.Route {
		return topolint.Route{Attempts: 8, LongestRun: time.Minute,
			Queues: []topolint.Queue{{Name: name, Role: "work", Args: declared, Consumed: true}}}
	}
	api, err := topolint.NewAPI(c.ManagementURLs[0], "", "")
	require.NoError(t, err)
	var found []topolint.Finding
	testenv.WaitFor(t, "the policy to apply", func() bool {
		found, err = topolint.Lint(t.Context(), api, "/", []topolint.Route{route("lint.ok"), route("lint.low"), route("lint.ttl")})
		require.NoError(t, err)
		for _, f := range found {
			if f.Rule == "ttl-without-dead-letter" {
				return true
			}
		}
		return false
	})
	got := map[string][]string{}
	for _, f := range found {
		got[f.Queue] = append(got[f.Queue], f.Severity+" "+f.Rule)
	}
	require.Empty(t, got["lint.ok"])
	require.ElementsMatch(t, []string{"warning policy-override", "error delivery-limit"}, got["lint.low"])
	require.ElementsMatch(t, []string{"error no-dead-letter-target", "error ttl-without-dead-letter"}, got["lint.ttl"])
}
