// Package amqpdial is the one way inboxmq connects to RabbitMQ: the
// consumer (and its publisher of retry and dead-letter copies), the
// parker, the outbox relay, the worker's exchange declaration and inboxctl
// all dial through a [Dialer].
//
// The broker address is one amqp:// or amqps:// URL or a comma-separated
// list of them, the nodes of a cluster ([Parse]). A Dialer tries one node
// after another until one answers, each within the per-node timeout.
// Each process starts at a random node and every new connection one node
// further than the previous one, so that many workers spread over the
// cluster; a connection dialed again (by its connection name, after it was
// lost) starts at the node after the one it was on, so it tries another
// node first.
// Every connect, failover and close is logged with the node (host:port)
// and the redacted URL, and reported to Config.OnNode (the metrics).
//
// Its errors carry no package prefix: every caller wraps them with its
// own ("consumer: …", "outbox: …"). Passwords never appear in them.
package amqpdial

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The roles of inboxmq's broker connections: the role label of the metrics
// and the role key of the log lines.
const (
	RoleConsumer  = "consumer"  // the consumer's consuming connection
	RolePublisher = "publisher" // the consumer's connection for retry and dead-letter copies
	RoleParker    = "parker"    // controlrun.DialParker's connection
	RoleRelay     = "relay"     // an outbox relay lane's connection
	RoleAdmin     = "admin"     // a short-lived connection: declarations, inboxctl
	RoleProducer  = "producer"  // a producer.Producer's connection
)

// Config configures a [Dialer].
type Config struct {
	// URL is the broker address: one amqp:// or amqps:// URL or a
	// comma-separated list of them. Required.
	URL string
	// TLS configures TLS for amqps:// URLs; each dial uses a clone.
	// Defaults to nil: an empty tls.Config (the system roots, the URL's
	// host name).
	TLS *tls.Config
	// Heartbeat is the AMQP heartbeat interval. Defaults to 10s.
	Heartbeat time.Duration
	// Timeout bounds one node's dial (TCP, TLS and AMQP handshake), within
	// the deadline of Dial's context. Defaults to 15s.
	Timeout time.Duration
	// Logger receives a line for every connect, failover, unreachable node
	// and closed connection. Defaults to nil, which discards them.
	Logger *slog.Logger
	// OnNode, when set, is called with the connection's role and node
	// (host:port) when a connection opens (connected true) and when it
	// closes (false). Defaults to nil.
	OnNode func(role, node string, connected bool)
	// OnConn, when set, gets every network connection dialed, before the
	// handshakes (tests use it to cut a connection). Defaults to nil.
	OnConn func(net.Conn)
}

// Dialer dials one node of a broker address that answers. It is safe for
// concurrent use. Build it with [New].
type Dialer struct {
	cfg   Config
	nodes []Node
	log   *slog.Logger
	next  atomic.Uint64

	mu   sync.Mutex
	last map[string]int // connection name -> index of its last connection's node
}

// New parses cfg.URL and returns a Dialer. It does not connect.
func New(cfg Config) (*Dialer, error) {
	nodes, err := Parse(cfg.URL)
	if err != nil {
		return nil, err
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 10 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 15 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &Dialer{cfg: cfg, nodes: nodes, log: log, last: make(map[string]int)}
	d.next.Store(uint64(rand.IntN(len(nodes)))) //nolint:gosec // spreading load, not a secret
	return d, nil
}

// Dial connects to one node that answers and returns the connection and
// its node. A connection name dialed before starts at the node after the
// one its last connection was on (that node may be the one that went
// away); a new name starts one node further than the previous new name.
// name is the connection_name client property (shown by the broker's
// management and rabbitmqctl list_connections); role is reported with the
// node. Each node's dial is bounded by Config.Timeout and by ctx, which
// also ends the whole attempt. If no node answers, the error lists every
// node's failure, passwords redacted.
func (d *Dialer) Dial(ctx context.Context, name, role string) (*amqp.Connection, Node, error) {
	conn, _, n, err := d.dial(ctx, name, role, false)
	return conn, n, err
}

// DialHeld is [Dialer.Dial] for a connection whose socket writes the
// caller can hold and send in one write: it also returns the connection's
// network connection as a [HoldConn] (under TLS, if the URL is amqps://, so
// a hold queues the TLS records). Closing the amqp.Connection closes it.
func (d *Dialer) DialHeld(ctx context.Context, name, role string) (*amqp.Connection, *HoldConn, Node, error) {
	return d.dial(ctx, name, role, true)
}

func (d *Dialer) dial(ctx context.Context, name, role string, hold bool) (*amqp.Connection, *HoldConn, Node, error) {
	d.mu.Lock()
	prev, redial := d.last[name]
	d.mu.Unlock()
	start := prev + 1
	if !redial {
		start = int(d.next.Add(1) - 1)
	}
	start %= len(d.nodes)
	var errs []error
	for i := range d.nodes {
		idx := (start + i) % len(d.nodes)
		n := d.nodes[idx]
		conn, hc, err := d.dialNode(ctx, n, name, hold)
		if err == nil {
			d.connected(conn, idx, name, role)
			return conn, hc, n, nil
		}
		err = redactErr(d.nodes, err)
		errs = append(errs, fmt.Errorf("%s: %w", n.Redacted(), err))
		if ctx.Err() != nil {
			errs = append(errs, ctx.Err())
			break // the whole attempt is over
		}
		if len(d.nodes) > 1 {
			d.log.LogAttrs(ctx, slog.LevelWarn, "broker node unreachable",
				slog.String("role", role), slog.String("connection_name", name),
				slog.String("node", n.Addr), slog.String("url", n.Redacted()), slog.Any("error", err))
		}
	}
	return nil, nil, Node{}, &dialError{nodes: len(d.nodes), errs: errs}
}

// dialError is a failed Dial: every node's error, in the order tried.
type dialError struct {
	nodes int
	errs  []error
}

func (e *dialError) Error() string {
	if e.nodes == 1 {
		return "connect to " + e.errs[0].Error()
	}
	msgs := make([]string, len(e.errs))
	for i, err := range e.errs {
		msgs[i] = err.Error()
	}
	return fmt.Sprintf("no broker node answered (%d nodes): %s", e.nodes, strings.Join(msgs, "; "))
}

func (e *dialError) Unwrap() []error { return e.errs }

// dialNode dials node n; with hold, amqp091 gets the network connection
// as a HoldConn, returned too.
func (d *Dialer) dialNode(ctx context.Context, n Node, name string, hold bool) (*amqp.Connection, *HoldConn, error) {
	timeout := d.cfg.Timeout
	if deadline, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(deadline))
	}
	if timeout <= 0 {
		return nil, nil, context.DeadlineExceeded
	}
	var tlsCfg *tls.Config
	if d.cfg.TLS != nil {
		tlsCfg = d.cfg.TLS.Clone() // amqp091 may set ServerName on it
	}
	props := amqp.Table{"product": "inboxmq"}
	if name != "" {
		props["connection_name"] = name
	}
	var stop func() bool
	var hc *HoldConn
	conn, err := amqp.DialConfig(n.URL, amqp.Config{
		Heartbeat:       d.cfg.Heartbeat,
		TLSClientConfig: tlsCfg,
		Locale:          "en_US",
		Properties:      props,
		Dial: func(network, addr string) (net.Conn, error) {
			nd := net.Dialer{Timeout: timeout}
			nc, err := nd.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// Bounds the TLS and AMQP handshakes; amqp091 clears it after.
			if err := nc.SetDeadline(time.Now().Add(timeout)); err != nil {
				_ = nc.Close()
				return nil, err
			}
			// ctx's end also ends the handshakes in progress.
			stop = context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Now()) })
			if d.cfg.OnConn != nil {
				d.cfg.OnConn(nc)
			}
			if hold {
				// amqp091 wraps it in its TLS client, if any, and
				// passes the deadlines through to nc.
				hc = NewHoldConn(nc)
				return hc, nil
			}
			return nc, nil
		},
	})
	if stop != nil && !stop() && err == nil {
		_ = conn.Close() // ctx ended as the handshake finished
		return nil, nil, ctx.Err()
	}
	if err != nil {
		return nil, nil, err
	}
	return conn, hc, nil
}

// connected logs the connect (a failover when the same connection name
// was last on another node), reports it, and watches for the close.
func (d *Dialer) connected(conn *amqp.Connection, idx int, name, role string) {
	n := d.nodes[idx]
	d.mu.Lock()
	prevIdx, had := d.last[name]
	d.last[name] = idx
	d.mu.Unlock()
	prev := d.nodes[prevIdx].Addr
	attrs := []slog.Attr{
		slog.String("role", role), slog.String("connection_name", name),
		slog.String("node", n.Addr), slog.String("url", n.Redacted()),
	}
	if had && prev != n.Addr {
		d.log.LogAttrs(context.Background(), slog.LevelWarn, "broker failover",
			append(attrs, slog.String("previous_node", prev))...)
	} else {
		d.log.LogAttrs(context.Background(), slog.LevelInfo, "broker connection opened", attrs...)
	}
	if d.cfg.OnNode != nil {
		d.cfg.OnNode(role, n.Addr, true)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		err, ok := <-closed
		if ok && err != nil {
			d.log.LogAttrs(context.Background(), slog.LevelWarn, "broker connection lost",
				append(attrs, slog.Any("error", redactErr(d.nodes, err)))...)
		} else {
			d.log.LogAttrs(context.Background(), slog.LevelDebug, "broker connection closed", attrs...)
		}
		if d.cfg.OnNode != nil {
			d.cfg.OnNode(role, n.Addr, false)
		}
	}()
}
