package amqpdial

import (
	"fmt"
	"net"
	"sync"
)

// HoldConn is a network connection whose writes can be held in memory and
// sent in one write: between [HoldConn.Hold] and [HoldConn.Release] every
// Write, from any goroutine, is queued, and Release writes the queue to
// the connection at once. Outside a hold, a Write goes straight through.
// Writes are serialized, so the bytes keep their order: a Write that comes
// while Release writes waits for it. Every other method (Read, the
// deadlines, the addresses) is the underlying connection's.
//
// A hold must be short, with no waiting for the peer inside it: what the
// connection's other writers send meanwhile (amqp091's heartbeats and its
// answers to the broker) waits for the Release too.
//
// Once a write to the connection has failed, the stream is broken (a frame
// may have gone out in part): HoldConn closes the connection, and every
// later Write and Release returns that error. Closing the connection
// during a hold drops the queued bytes, and the Release returns an error.
//
// A HoldConn is safe for concurrent use. Build it with [NewHoldConn].
type HoldConn struct {
	net.Conn

	mu     sync.Mutex
	held   bool
	buf    []byte
	err    error // set by a failed write or Close: the stream is over
	writes int64
}

// maxKeptHold is the largest queue buffer a HoldConn keeps for the next
// hold; a larger one (a batch of large messages) is left to the GC.
const maxKeptHold = 1 << 20

// NewHoldConn returns c with its writes holdable.
func NewHoldConn(c net.Conn) *HoldConn { return &HoldConn{Conn: c} }

// Hold starts queueing the writes. Hold during a hold does nothing.
func (c *HoldConn) Hold() {
	c.mu.Lock()
	c.held = true
	c.mu.Unlock()
}

// Release ends the hold and writes the queued bytes in one write. It
// returns the write's error (the connection is then closed), or an error
// when the connection was closed or had failed with bytes queued. Release
// without a hold, or with nothing queued, writes nothing.
func (c *HoldConn) Release() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.held {
		return nil
	}
	c.held = false
	buf := c.buf
	if cap(buf) > maxKeptHold {
		c.buf = nil
	} else {
		c.buf = buf[:0]
	}
	if len(buf) == 0 {
		return nil
	}
	if c.err != nil {
		return fmt.Errorf("%d held bytes not written: %w", len(buf), c.err)
	}
	return c.write(buf)
}

// Write queues p during a hold and writes it otherwise.
func (c *HoldConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if c.held {
		c.buf = append(c.buf, p...)
		return len(p), nil
	}
	if err := c.write(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// write writes p to the connection; c.mu is held. A failed write closes
// the connection.
func (c *HoldConn) write(p []byte) error {
	c.writes++
	if _, err := c.Conn.Write(p); err != nil {
		c.err = err
		_ = c.Conn.Close()
		return err
	}
	return nil
}

// Close closes the connection and drops the bytes queued by a hold. It
// does not wait for a write in progress: closing the connection ends it.
func (c *HoldConn) Close() error {
	err := c.Conn.Close() // first: it ends a write that holds c.mu
	c.mu.Lock()
	if c.err == nil {
		c.err = net.ErrClosed
	}
	c.mu.Unlock()
	return err
}

// Writes returns the number of writes made to the connection so far.
func (c *HoldConn) Writes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writes
}
