//go:build unix

// Package clustertest starts, for a test, the local cluster of
// scripts/cluster.sh: three clustered RabbitMQ nodes, a PostgreSQL primary
// with a streaming standby, and Redis primary and replica behind three
// Sentinels, each on its own ports with its own data folders. It gives the
// test the URLs and the faults to inject (kill or restart a broker node,
// promote the standby, fail Redis over). It is for tests only; production
// code never imports it.
//
// A cluster takes a minute or so to start, so a package starts one and shares
// it between its tests (one Start per package run, from a top-level test whose
// subtests use it). Start never skips: a cluster that cannot start fails the
// test.
package clustertest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Options configure Start. A nil *Options is the same as a zero Options.
type Options struct {
	// TLS also starts TLS listeners (amqps, PostgreSQL ssl, Redis and
	// Sentinel tls-port) with a CA made for this cluster, and fills
	// Cluster's TLS URLs and CAFile. Defaults to false.
	TLS bool

	// PortBase is the first of the cluster's ports (it uses PortBase to
	// PortBase+38, laid out in scripts/cluster.sh). Defaults to 0: the first
	// free base of 25800, 25850, … 26750, so clusters of test packages that
	// run at once do not collide, nor with `make cluster`'s 25700.
	PortBase int
}

// Cluster is a running cluster and the URLs to reach it. Its processes are
// stopped and its folder removed when the test that started it ends.
type Cluster struct {
	// AMQPURLs holds one amqp:// URL per RabbitMQ node (guest, vhost /),
	// node 1 first.
	AMQPURLs []string
	// AMQPSURLs holds one amqps:// URL per node; empty without TLS.
	AMQPSURLs []string
	// RabbitNodes holds the Erlang node names, node 1 first.
	RabbitNodes []string
	// ManagementURLs holds one management API URL per node (guest), node 1
	// first.
	ManagementURLs []string

	// DatabaseURL lists primary and standby with
	// target_session_attrs=read-write: it reaches whichever is writable.
	DatabaseURL string
	// PrimaryURL and StandbyURL reach one server each (by port, whatever
	// its role after PromoteStandby).
	PrimaryURL, StandbyURL string
	// DatabaseTLSURL is DatabaseURL with sslmode=verify-full against
	// CAFile; empty without TLS.
	DatabaseTLSURL string

	// RedisURL is redis+sentinel://S1,S2,S3/mymaster. With TLS the
	// Sentinels name the master's TLS port, so use RedisTLSURL.
	RedisURL string
	// RedisTLSURL is rediss+sentinel:// on the Sentinels' TLS ports; empty
	// without TLS.
	RedisTLSURL string
	// RedisPrimaryURL reaches the data node that started as master, on its
	// plain port.
	RedisPrimaryURL string

	// CAFile is the PEM file of the cluster's CA; empty without TLS.
	CAFile string
	// Dir holds the cluster's data, logs and pid files (CLUSTER_DIR).
	Dir string

	script string
	env    []string
}

// Timeouts of the script's commands.
const (
	upTimeout      = 5 * time.Minute
	downTimeout    = 2 * time.Minute
	nodeTimeout    = 3 * time.Minute
	commandTimeout = 2 * time.Minute
	claimTimeout   = 5 * time.Minute
)

// Port bases Start tries when Options.PortBase is 0.
const (
	firstAutoBase = 25800
	autoBaseStep  = 50
	autoBases     = 20
	portSpan      = 39
)

// Start starts a cluster with scripts/cluster.sh up, in a folder of its own
// under os.TempDir, and stops it when the test ends. It fails the test, with
// the script's output, when the cluster cannot start.
func Start(t testing.TB, opts *Options) *Cluster {
	t.Helper()
	if opts == nil {
		opts = &Options{}
	}
	script, err := findScript()
	if err != nil {
		t.Fatalf("clustertest: %v", err)
	}
	c := &Cluster{script: script}
	base, release := claimBase(t, c, opts.PortBase)
	c.Dir = filepath.Join(os.TempDir(), "inboxmq-cluster-"+strconv.Itoa(base))
	tlsFlag := "0"
	if opts.TLS {
		tlsFlag = "1"
	}
	c.env = append(os.Environ(),
		"CLUSTER_DIR="+c.Dir,
		"CLUSTER_PORT_BASE="+strconv.Itoa(base),
		"CLUSTER_TLS="+tlsFlag,
	)
	t.Cleanup(func() {
		defer release()
		if os.Getenv("CLUSTERTEST_KEEP") != "" {
			t.Logf("clustertest: CLUSTERTEST_KEEP is set: the cluster in %s keeps running (scripts/cluster.sh down with CLUSTER_DIR=%s CLUSTER_PORT_BASE=%d stops it)", c.Dir, c.Dir, base)
			return
		}
		if out, err := c.run(downTimeout, "down"); err != nil {
			t.Errorf("clustertest: down: %v\n%s", err, out)
		}
	})
	begin := time.Now()
	if out, err := c.run(upTimeout, "up"); err != nil {
		t.Fatalf("clustertest: the cluster did not start (port base %d, folder %s): %v\n%s", base, c.Dir, err, out)
	}
	t.Logf("clustertest: cluster up in %s (port base %d, TLS %t, folder %s)", time.Since(begin).Round(time.Second), base, opts.TLS, c.Dir)
	if err := c.readEnv(filepath.Join(c.Dir, "env")); err != nil {
		t.Fatalf("clustertest: %v", err)
	}
	return c
}

// KillRabbit sends SIGKILL to RabbitMQ node i (1..3) and waits until it has
// exited.
func (c *Cluster) KillRabbit(t testing.TB, i int) {
	t.Helper()
	c.must(t, commandTimeout, "kill-rabbit", strconv.Itoa(i))
}

// StartRabbit starts RabbitMQ node i (1..3) again and waits until it runs in
// the cluster.
func (c *Cluster) StartRabbit(t testing.TB, i int) {
	t.Helper()
	c.must(t, nodeTimeout, "start-rabbit", strconv.Itoa(i))
}

// RestartRabbit stops RabbitMQ node i (1..3) gracefully, starts it and waits
// until it has rejoined the cluster.
func (c *Cluster) RestartRabbit(t testing.TB, i int) {
	t.Helper()
	c.must(t, nodeTimeout, "restart-rabbit", strconv.Itoa(i))
}

// QueueLeader returns the index (1..3) of the node that leads the quorum
// queue as the running nodes see it. Right after its leader died it may
// still name that node until a new leader is elected: poll until it changes.
func (c *Cluster) QueueLeader(t testing.TB, vhost, queue string) int {
	t.Helper()
	out := c.must(t, commandTimeout, "rabbit-leader", vhost, queue)
	i, err := strconv.Atoi(strings.TrimSpace(lastLine(out)))
	if err != nil || i < 1 || i > 3 {
		t.Fatalf("clustertest: rabbit-leader printed no node index:\n%s", out)
	}
	return i
}

// Rabbitmqctl runs rabbitmqctl with args against node i (1..3) and returns
// its output.
func (c *Cluster) Rabbitmqctl(t testing.TB, i int, args ...string) string {
	t.Helper()
	return c.must(t, commandTimeout, append([]string{"rabbitmqctl", strconv.Itoa(i)}, args...)...)
}

// PromoteStandby fences the PostgreSQL primary (a fast stop), promotes the
// standby once it has the primary's last WAL, and waits until it accepts
// writes. The old primary stays stopped.
func (c *Cluster) PromoteStandby(t testing.TB) {
	t.Helper()
	c.must(t, commandTimeout, "promote-pg")
}

// RedisFailover makes the Sentinels fail the Redis master over to the
// replica and waits until every Sentinel names the new master and the old
// master replicates from it.
func (c *Cluster) RedisFailover(t testing.TB) {
	t.Helper()
	c.must(t, commandTimeout, "redis-failover")
}

// must runs a script command and fails the test with its output if it fails.
func (c *Cluster) must(t testing.TB, timeout time.Duration, args ...string) string {
	t.Helper()
	out, err := c.run(timeout, args...)
	if err != nil {
		t.Fatalf("clustertest: scripts/cluster.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// run runs scripts/cluster.sh with args, bounded by timeout; on timeout the
// script and the commands it waits on are killed (the servers it started run
// in sessions of their own).
func (c *Cluster) run(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{c.script}, args...)...)
	cmd.Env = c.env
	cmd.Dir = filepath.Dir(filepath.Dir(c.script))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var buf bytes.Buffer
	cmd.Stdout = &buf
	cmd.Stderr = &buf
	err := cmd.Run()
	if errors.Is(err, exec.ErrWaitDelay) {
		// The script succeeded; a server it started kept its output open.
		err = nil
	}
	if ctx.Err() != nil {
		err = errors.Join(fmt.Errorf("clustertest: no answer within %s", timeout), err)
	}
	return buf.String(), err
}

// readEnv fills the URLs from the export lines the script wrote.
func (c *Cluster) readEnv(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("clustertest: the script wrote no URLs: %w", err)
	}
	defer f.Close()
	vars := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "export ")
		if !ok {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		vars[name] = strings.Trim(value, "'")
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("clustertest: read %s: %w", path, err)
	}
	list := func(s string) []string {
		if s == "" {
			return nil
		}
		return strings.Split(s, ",")
	}
	c.AMQPURLs = list(vars["CLUSTER_AMQP_URLS"])
	c.AMQPSURLs = list(vars["CLUSTER_AMQPS_URLS"])
	c.RabbitNodes = list(vars["CLUSTER_RABBIT_NODES"])
	c.ManagementURLs = list(vars["CLUSTER_MANAGEMENT_URLS"])
	c.DatabaseURL = vars["CLUSTER_DATABASE_URL"]
	c.PrimaryURL = vars["CLUSTER_PG_PRIMARY_URL"]
	c.StandbyURL = vars["CLUSTER_PG_STANDBY_URL"]
	c.DatabaseTLSURL = vars["CLUSTER_DATABASE_TLS_URL"]
	c.RedisURL = vars["CLUSTER_REDIS_URL"]
	c.RedisTLSURL = vars["CLUSTER_REDIS_TLS_URL"]
	c.RedisPrimaryURL = vars["CLUSTER_REDIS_PRIMARY_URL"]
	c.CAFile = vars["CLUSTER_CA_FILE"]
	if len(c.AMQPURLs) != 3 || len(c.RabbitNodes) != 3 || c.DatabaseURL == "" || c.RedisURL == "" {
		return fmt.Errorf("clustertest: %s lacks URLs", path)
	}
	return nil
}

// claimBase picks the cluster's port base and holds a lock on it until the
// returned release runs, so two test processes never share a base. An
// explicit base is waited for (bounded); base 0 takes the first free one.
func claimBase(t testing.TB, c *Cluster, base int) (int, func()) {
	t.Helper()
	if base != 0 {
		deadline := time.Now().Add(claimTimeout)
		for {
			if release, ok := tryClaim(t, c, base); ok {
				return base, release
			}
			if time.Now().After(deadline) {
				t.Fatalf("clustertest: port base %d stayed taken for %s (another test's cluster, or other servers on ports %d-%d)", base, claimTimeout, base, base+portSpan-1)
			}
			time.Sleep(time.Second) // another test process holds the base
		}
	}
	for i := range autoBases {
		b := firstAutoBase + i*autoBaseStep
		if release, ok := tryClaim(t, c, b); ok {
			return b, release
		}
	}
	t.Fatalf("clustertest: no free port base among %d, %d, … %d (each needs %d free ports)", firstAutoBase, firstAutoBase+autoBaseStep, firstAutoBase+(autoBases-1)*autoBaseStep, portSpan)
	return 0, nil
}

// tryClaim locks base's claim file without waiting. Holding it, it removes a
// cluster a crashed run left on that base, then checks that the ports are
// free (no other servers on them).
func tryClaim(t testing.TB, c *Cluster, base int) (func(), bool) {
	t.Helper()
	dir := filepath.Join(os.TempDir(), "inboxmq-cluster-"+strconv.Itoa(base))
	f, err := os.OpenFile(dir+".claim", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatalf("clustertest: %v", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, false
	}
	release := func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close()
	}
	if _, err := os.Stat(dir); err == nil {
		stale := &Cluster{script: c.script, env: append(os.Environ(), "CLUSTER_DIR="+dir, "CLUSTER_PORT_BASE="+strconv.Itoa(base))}
		if out, err := stale.run(downTimeout, "down"); err != nil {
			t.Logf("clustertest: could not remove the cluster a previous run left in %s: %v\n%s", dir, err, out)
			release()
			return nil, false
		}
	}
	for p := base; p < base+portSpan; p++ {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			release()
			return nil, false
		}
		_ = ln.Close()
	}
	return release, true
}

// findScript walks up from the working folder to the module root (go.mod)
// and returns its scripts/cluster.sh.
func findScript() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("clustertest: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			script := filepath.Join(dir, "scripts", "cluster.sh")
			if _, err := os.Stat(script); err != nil {
				return "", fmt.Errorf("clustertest: module root %s has no scripts/cluster.sh: %w", dir, err)
			}
			return script, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("clustertest: no go.mod above the working folder")
		}
		dir = parent
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}
