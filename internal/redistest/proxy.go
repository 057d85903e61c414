package redistest

import (
	"net"
	"net/url"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/inboxmq/inboxmq/internal/testenv"
)

// Proxy is a TCP proxy in front of the test Redis that can hang: while
// paused it accepts connections and reads what clients send, but forwards
// nothing either way, holding the bytes it read, as a stopped Redis process
// or a black-holed network does. Resume forwards the held bytes, so
// commands a client gave up on during the pause still run, as they do when
// a hung Redis comes back.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
	held   int // chunks read and not yet forwarded
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewProxy starts a proxy in front of the test Redis on a loopback port of
// its own; it is stopped when the test ends.
func NewProxy(t testing.TB) *Proxy {
	t.Helper()
	u, err := url.Parse(testenv.RedisURL())
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return NewProxyTo(t, u.Host)
}

// NewProxyTo starts a proxy in front of any TCP service (PostgreSQL,
// RabbitMQ) at target (host:port); it is stopped when the test ends.
func NewProxyTo(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: proxy: %v", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

// Client returns a client of the test Redis (same database) through the
// proxy, with ContextTimeoutEnabled set and no retries, as the lock
// middleware's clients are built.
func (p *Proxy) Client(t testing.TB) redis.UniversalClient {
	t.Helper()
	opt, err := redis.ParseURL(testenv.RedisURL())
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	opt.Addr = p.ln.Addr().String()
	opt.ContextTimeoutEnabled = true
	opt.MaxRetries = -1
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Addr is the proxy's address (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Drop closes every connection through the proxy, as a network failure
// would; new connections are accepted (and held while paused).
func (p *Proxy) Drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// Pause stops forwarding: from now on bytes read from either side are held.
func (p *Proxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = true
}

// Resume forwards again, and returns once every byte held during the pause
// has been written on.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = false
	p.cond.Broadcast()
	for p.held > 0 && !p.closed {
		p.cond.Wait()
	}
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			return
		}
		p.conns[client], p.conns[server] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(server, client)
		go p.pipe(client, server)
	}
}

// pipe copies from src to dst, holding each chunk while paused.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		_ = dst.Close()
		_ = src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			p.held++
			for p.paused && !p.closed {
				p.cond.Wait()
			}
			p.mu.Unlock()
			_, werr := dst.Write(buf[:n])
			p.mu.Lock()
			p.held--
			p.cond.Broadcast()
			p.mu.Unlock()
			if werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or closed: the held bytes, if any, went first
		}
	}
}

func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}
