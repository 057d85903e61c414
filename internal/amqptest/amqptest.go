// Package amqptest gives each test its own RabbitMQ queue names, a
// connection, publishing with confirms and clean-up of everything the test
// declared. It is for tests only; production code never imports it.
package amqptest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9]+`)

// QueueName returns a queue name unique to this test and run. Every queue
// derived from it (DLQ, retry tiers) is deleted when the test ends.
func QueueName(t testing.TB) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := strings.Trim(unsafeChars.ReplaceAllString(t.Name(), "-"), "-")
	if len(name) > 80 {
		name = name[:80]
	}
	q := fmt.Sprintf("t.%s.%s", name, hex.EncodeToString(b[:]))
	conn := Dial(t)
	t.Cleanup(func() { DeleteQueues(t, conn, q) })
	return q
}

// Dial opens a connection to the test broker, closed when the test ends.
func Dial(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(testenv.AMQPURL(), amqp.Config{
		Properties: amqp.Table{"connection_name": "inboxmq-test " + t.Name()},
		Heartbeat:  10 * time.Second,
	})
	if err != nil {
		testenv.Unavailable(t, "RabbitMQ", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// DeleteQueues deletes queue, its DLQ, dead and parked queues and its
// default retry tiers (errors ignored: some may never have been declared).
func DeleteQueues(t testing.TB, conn *amqp.Connection, queue string) {
	t.Helper()
	names := []string{queue, inboxtype.DeadLetterQueue(queue), queue + ".dead", inboxtype.ParkedQueue(queue)}
	for _, tier := range consumer.DefaultRetryTiers {
		names = append(names, inboxtype.RetryQueue(queue, tier))
	}
	for _, tier := range extraTiers {
		names = append(names, inboxtype.RetryQueue(queue, tier))
	}
	for _, n := range names {
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		_, _ = ch.QueueDelete(n, false, false, false)
		_ = ch.Close()
	}
}

// extraTiers are short tiers tests commonly use.
var extraTiers = []time.Duration{10 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, 2 * time.Second, 3 * time.Second}

// Publisher publishes persistent messages with publisher confirms.
type Publisher struct {
	t  testing.TB
	ch *amqp.Channel
}

// NewPublisher opens a confirm-mode channel on conn.
func NewPublisher(t testing.TB, conn *amqp.Connection) *Publisher {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("amqptest: channel: %v", err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("amqptest: confirm mode: %v", err)
	}
	t.Cleanup(func() { _ = ch.Close() })
	return &Publisher{t: t, ch: ch}
}

// Publish sends body to queue through the default exchange and waits for
// the broker's confirm.
func (p *Publisher) Publish(queue string, body []byte, msg amqp.Publishing) {
	p.t.Helper()
	msg.Body = body
	if msg.DeliveryMode == 0 {
		msg.DeliveryMode = amqp.Persistent
	}
	if msg.ContentType == "" {
		msg.ContentType = "application/json"
	}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
	defer cancel()
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, msg)
	if err != nil {
		p.t.Fatalf("amqptest: publish: %v", err)
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil || !ok {
		p.t.Fatalf("amqptest: publish not confirmed (ok=%v): %v", ok, err)
	}
}

// Get fetches one message from queue without waiting (ok=false if empty) and
// acks it.
func Get(t testing.TB, conn *amqp.Connection, queue string) (amqp.Delivery, bool) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("amqptest: channel: %v", err)
	}
	defer ch.Close()
	d, ok, err := ch.Get(queue, true)
	if err != nil {
		t.Fatalf("amqptest: get %s: %v", queue, err)
	}
	return d, ok
}

// Drain fetches every message currently in queue (acking them).
func Drain(t testing.TB, conn *amqp.Connection, queue string) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	for {
		d, ok := Get(t, conn, queue)
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// Depth returns the number of ready messages in queue (passive declare).
func Depth(t testing.TB, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("amqptest: channel: %v", err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		t.Fatalf("amqptest: inspect %s: %v", queue, err)
	}
	return q.Messages
}

// DepthOrZero is Depth for a queue that may not be declared yet (a parked
// queue is declared by the first copy parked in it): a missing queue has 0
// messages.
func DepthOrZero(t testing.TB, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("amqptest: channel: %v", err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return 0
		}
		t.Fatalf("amqptest: inspect %s: %v", queue, err)
	}
	return q.Messages
}

// CloseConnection closes, from the server side (rabbitmqctl, as an operator
// or a failing node would), the connection whose connection_name client
// property is name. It waits until the connection is listed.
func CloseConnection(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
	defer cancel()
	var pid string
	testenv.WaitFor(t, "connection "+name+" listed by rabbitmqctl", func() bool {
		out, err := exec.CommandContext(ctx, "rabbitmqctl", "-q", "list_connections", "pid", "client_properties").CombinedOutput()
		if err != nil {
			t.Fatalf("amqptest: rabbitmqctl list_connections: %v: %s", err, out)
		}
		for line := range strings.SplitSeq(string(out), "\n") {
			if strings.Contains(line, `"`+name+`"`) {
				pid = strings.Fields(line)[0]
				return true
			}
		}
		return false
	})
	out, err := exec.CommandContext(ctx, "rabbitmqctl", "-q", "close_connection", pid, "inboxmq test: server-side close").CombinedOutput()
	if err != nil {
		t.Fatalf("amqptest: rabbitmqctl close_connection %s: %v: %s", pid, err, out)
	}
}

// SetQueuePolicy applies a RabbitMQ policy (rabbitmqctl set_policy, as an
// operator would) whose pattern matches exactly queue and nothing else, and
// waits until the queue reports it. The policy is named after the queue and
// cleared when the test ends. queue must come from [QueueName], so that a
// test never changes anything else on a shared broker. A missing or failing
// rabbitmqctl fails the test: CI installs it (package rabbitmq-server).
func SetQueuePolicy(t testing.TB, queue, definition string) {
	t.Helper()
	if !strings.HasPrefix(queue, "t.") {
		t.Fatalf("amqptest: SetQueuePolicy on %q: only test queues from QueueName", queue)
	}
	uri, err := amqp.ParseURI(testenv.AMQPURL())
	if err != nil {
		t.Fatalf("amqptest: parse AMQP URL: %v", err)
	}
	vhost := cmp.Or(uri.Vhost, "/")
	rabbitmqctl := func(args ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
		defer cancel()
		out, err := exec.CommandContext(ctx, "rabbitmqctl", append([]string{"-q", "-p", vhost}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("amqptest: rabbitmqctl %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	pattern := "^" + regexp.QuoteMeta(queue) + "$"
	rabbitmqctl("set_policy", "--apply-to", "queues", "--priority", "10", queue, pattern, definition)
	t.Cleanup(func() { rabbitmqctl("clear_policy", queue) })
	// A classic queue answers list_queues itself, so once it names the
	// policy it has applied it.
	testenv.WaitFor(t, "policy "+queue+" applied", func() bool {
		for line := range strings.SplitSeq(rabbitmqctl("list_queues", "name", "policy"), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == queue && f[1] == queue {
				return true
			}
		}
		return false
	})
}

// DeadURL returns the test broker's URL with its host and port replaced by
// a loopback port that nothing listens on: a cluster node that is down
// (connections to it are refused at once).
func DeadURL(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("amqptest: listen: %v", err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	u, err := url.Parse(testenv.AMQPURL())
	if err != nil {
		t.Fatalf("amqptest: parse AMQP URL: %v", err)
	}
	u.Host = addr
	return u.String()
}

// AliasURL returns the test broker's URL under its other loopback name
// (127.0.0.1 and localhost swapped), so that one broker plays a second
// cluster node. A broker that is not on loopback has no such alias: the
// test fails with CI=true and is skipped otherwise.
func AliasURL(t testing.TB) string {
	t.Helper()
	u, err := url.Parse(testenv.AMQPURL())
	if err != nil {
		t.Fatalf("amqptest: parse AMQP URL: %v", err)
	}
	port := cmp.Or(u.Port(), "5672")
	switch u.Hostname() {
	case "127.0.0.1":
		u.Host = "localhost:" + port
	case "localhost":
		u.Host = "127.0.0.1:" + port
	default:
		msg := fmt.Sprintf("amqptest: TEST_AMQP_URL's host %s has no loopback alias: set it to 127.0.0.1 or localhost", u.Hostname())
		if testenv.CI() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return u.String()
}

// PublishTo sends body to exchange with routingKey and waits for the
// broker's confirm (mandatory: an unroutable message fails the test).
func (p *Publisher) PublishTo(exchange, routingKey string, body []byte, msg amqp.Publishing) {
	p.t.Helper()
	msg.Body = body
	if msg.DeliveryMode == 0 {
		msg.DeliveryMode = amqp.Persistent
	}
	if msg.ContentType == "" {
		msg.ContentType = "application/json"
	}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
	defer cancel()
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, routingKey, true, false, msg)
	if err != nil {
		p.t.Fatalf("amqptest: publish: %v", err)
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil || !ok {
		p.t.Fatalf("amqptest: publish not confirmed (ok=%v): %v", ok, err)
	}
}

// DeleteOrderedAtCleanup deletes, when the test ends, the topology of an
// ordered route on queue (consumer.OrderedOpts) with shards shard queues:
// the shard queues, the members queue and the exchange named queue (its
// DLQ goes with QueueName's clean-up).
func DeleteOrderedAtCleanup(t testing.TB, conn *amqp.Connection, queue string, shards int) {
	t.Helper()
	t.Cleanup(func() {
		names := []string{queue + ".members"}
		for i := range shards {
			names = append(names, consumer.ShardQueueName(queue, i))
		}
		for _, n := range names {
			ch, err := conn.Channel()
			if err != nil {
				return
			}
			_, _ = ch.QueueDelete(n, false, false, false)
			_ = ch.Close()
		}
		if ch, err := conn.Channel(); err == nil {
			_ = ch.ExchangeDelete(queue, false, false)
			_ = ch.Close()
		}
	})
}

// Vhost creates a virtual host of the test broker for this test alone
// (rabbitmqctl add_vhost, with full permissions for the URL's user),
// deletes it with everything in it when the test ends, and returns the
// broker URL pointing at it. A missing or failing rabbitmqctl fails the
// test: CI installs it (package rabbitmq-server).
func Vhost(t testing.TB) string {
	t.Helper()
	u, err := url.Parse(testenv.AMQPURL())
	if err != nil {
		t.Fatalf("amqptest: parse AMQP URL: %v", err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := strings.Trim(unsafeChars.ReplaceAllString(t.Name(), "-"), "-")
	if len(name) > 80 {
		name = name[:80]
	}
	vhost := fmt.Sprintf("t.%s.%s", name, hex.EncodeToString(b[:]))
	rabbitmqctl := func(args ...string) {
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
		defer cancel()
		out, err := exec.CommandContext(ctx, "rabbitmqctl", append([]string{"-q"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("amqptest: rabbitmqctl %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	rabbitmqctl("add_vhost", vhost)
	t.Cleanup(func() { rabbitmqctl("delete_vhost", vhost) })
	rabbitmqctl("set_permissions", "-p", vhost, cmp.Or(u.User.Username(), "guest"), ".*", ".*", ".*")
	u.Path = "/" + vhost
	u.RawPath = "/" + url.PathEscape(vhost)
	return u.String()
}

// DialURL opens a connection to rawURL (such as a [Vhost]'s), closed when
// the test ends.
func DialURL(t testing.TB, rawURL string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(rawURL, amqp.Config{
		Properties: amqp.Table{"connection_name": "inboxmq-test " + t.Name()},
		Heartbeat:  10 * time.Second,
	})
	if err != nil {
		testenv.Unavailable(t, "RabbitMQ", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// RequireConsistentHash fails the test unless the test broker has the
// rabbitmq_consistent_hash_exchange plugin, which ordered routes
// (consumer.OrderedOpts) and their exchanges need. It declares a
// throwaway exchange of that type on a connection of its own and deletes
// it; without the plugin the test fails with a message naming the fix.
// Call it first in every test that needs the plugin, so that a broker
// without it fails those tests alone, cleanly. It never skips, with
// CI=true or not: a missing plugin is a broken environment, not a pass.
func RequireConsistentHash(t testing.TB) {
	t.Helper()
	conn, err := amqp.DialConfig(testenv.AMQPURL(), amqp.Config{
		Properties: amqp.Table{"connection_name": "inboxmq-test probe " + t.Name()},
	})
	if err != nil {
		testenv.Unavailable(t, "RabbitMQ", err)
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("amqptest: channel: %v", err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "t.consistent-hash-probe." + hex.EncodeToString(b[:])
	if err := ch.ExchangeDeclare(name, consumer.ExchangeConsistentHash, false, true, false, false, nil); err != nil {
		t.Fatal(consistentHashFailure(name, err))
	}
	if err := ch.ExchangeDelete(name, false, false); err != nil {
		t.Fatalf("amqptest: delete exchange %s: %v", name, err)
	}
}

// consistentHashFailure describes a failed declaration of exchange as
// x-consistent-hash: when the broker does not know the type, it names the
// fix.
func consistentHashFailure(exchange string, err error) string {
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.CommandInvalid {
		return fmt.Sprintf("amqptest: the test broker lacks the rabbitmq_consistent_hash_exchange plugin that ordered routes need "+
			"(declaring exchange %s of type %s: %v): enable it with `rabbitmq-plugins enable rabbitmq_consistent_hash_exchange`, "+
			"or run `make up`, which enables it", exchange, consumer.ExchangeConsistentHash, err)
	}
	return fmt.Sprintf("amqptest: declare exchange %s of type %s: %v", exchange, consumer.ExchangeConsistentHash, err)
}

// DeclareOrdered declares what an ordered route (consumer.OrderedOpts)
// declares, without a consumer: a consistent-hash exchange named queue
// bound to shards shard queues with single active consumer. Everything
// is deleted when the test ends. queue must come from [QueueName].
func DeclareOrdered(t testing.TB, conn *amqp.Connection, queue string, shards int) {
	t.Helper()
	DeleteOrderedAtCleanup(t, conn, queue, shards)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("amqptest: channel: %v", err)
	}
	defer func() { _ = ch.Close() }()
	if err := ch.ExchangeDeclare(queue, consumer.ExchangeConsistentHash, true, false, false, false, nil); err != nil {
		t.Fatal(consistentHashFailure(queue, err))
	}
	for i := range shards {
		name := consumer.ShardQueueName(queue, i)
		if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-single-active-consumer": true}); err != nil {
			t.Fatalf("amqptest: declare %s: %v", name, err)
		}
		if err := ch.QueueBind(name, "1", queue, false, nil); err != nil {
			t.Fatalf("amqptest: bind %s: %v", name, err)
		}
	}
}

// ShardOf drains the shards of an ordered route on queue and returns, per
// routing key, the index of the shard its messages were in and their
// bodies in queue order. It fails the test when a key's messages are
// spread over several shards.
func ShardOf(t testing.TB, conn *amqp.Connection, queue string, shards int) (shardOf map[string]int, bodies map[string][]string) {
	t.Helper()
	shardOf, bodies = make(map[string]int), make(map[string][]string)
	for i := range shards {
		for _, d := range Drain(t, conn, consumer.ShardQueueName(queue, i)) {
			if s, ok := shardOf[d.RoutingKey]; ok && s != i {
				t.Fatalf("amqptest: key %s is in shards %d and %d", d.RoutingKey, s, i)
			}
			shardOf[d.RoutingKey] = i
			bodies[d.RoutingKey] = append(bodies[d.RoutingKey], string(d.Body))
		}
	}
	return shardOf, bodies
}
