package amqpdial_test

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/amqpdial"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// fakeConn records each Write it gets; it fails them with err when set.
type fakeConn struct {
	net.Conn // nil: only Write and Close are called

	mu       sync.Mutex
	writes   [][]byte
	err      error
	closed   bool
	blocking chan struct{} // when set, a Write signals started and waits for it
	started  chan struct{}
}

// block makes the next Writes wait until unblock, and signal started.
func (c *fakeConn) block() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.blocking, c.started = make(chan struct{}), make(chan struct{}, 2)
}

func (c *fakeConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	blocking, started := c.blocking, c.started
	c.mu.Unlock()
	if blocking != nil {
		started <- struct{}{}
		<-blocking
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	c.writes = append(c.writes, bytes.Clone(p))
	return len(p), nil
}

func (c *fakeConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}

func (c *fakeConn) got() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([][]byte(nil), c.writes...)
}

func write(t *testing.T, c net.Conn, s string) {
	t.Helper()
	n, err := c.Write([]byte(s))
	require.NoError(t, err)
	require.Equal(t, len(s), n)
}

func TestHoldConn_OneWritePerHold(t *testing.T) {
	t.Parallel()
	fc := &fakeConn{}
	hc := amqpdial.NewHoldConn(fc)

	write(t, hc, "a") // not held: straight through
	require.Equal(t, [][]byte{[]byte("a")}, fc.got())

	hc.Hold()
	for _, s := range []string{"b", "cd", "", "efg"} {
		write(t, hc, s)
	}
	require.Len(t, fc.got(), 1, "nothing written during the hold")
	require.NoError(t, hc.Release())
	require.Equal(t, [][]byte{[]byte("a"), []byte("bcdefg")}, fc.got(), "one write, in order")

	write(t, hc, "h") // released: straight through again
	hc.Hold()
	require.NoError(t, hc.Release(), "an empty hold")
	require.NoError(t, hc.Release(), "a release without a hold")
	require.Equal(t, [][]byte{[]byte("a"), []byte("bcdefg"), []byte("h")}, fc.got(), "no empty write")
	require.EqualValues(t, 3, hc.Writes())
}

// Writers on other goroutines during a hold are queued with the holder's
// writes, and each write's bytes stay whole and in order.
func TestHoldConn_ConcurrentWriters(t *testing.T) {
	t.Parallel()
	fc := &fakeConn{}
	hc := amqpdial.NewHoldConn(fc)
	const writers, each = 4, 200
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if _, err := hc.Write(fmt.Appendf(nil, "<%d:%d>", w, i)); err != nil {
					t.Errorf("write: %v", err)
				}
			}
		})
	}
	for range 50 {
		hc.Hold()
		write(t, hc, "<h>")
		require.NoError(t, hc.Release())
	}
	wg.Wait()

	all := bytes.Join(fc.got(), nil)
	require.Equal(t, 50, bytes.Count(all, []byte("<h>")))
	for w := range writers { // each writer's writes in its order, none torn
		next := 0
		for _, tok := range bytes.SplitAfter(all, []byte(">")) {
			var ww, i int
			if _, err := fmt.Sscanf(string(tok), "<%d:%d>", &ww, &i); err != nil || ww != w {
				continue
			}
			require.Equal(t, next, i, "writer %d", w)
			next++
		}
		require.Equal(t, each, next, "writer %d", w)
	}
	require.Equal(t, int64(len(fc.got())), hc.Writes())
}

// A Write that comes while Release writes waits for it: its bytes follow.
func TestHoldConn_WriteDuringReleaseFollows(t *testing.T) {
	t.Parallel()
	fc := &fakeConn{}
	hc := amqpdial.NewHoldConn(fc)
	hc.Hold()
	write(t, hc, "held")
	fc.block()
	released := make(chan error)
	go func() { released <- hc.Release() }()
	testenv.WaitChan(t, fc.started, "release writing")
	wrote := make(chan struct{})
	go func() {
		if _, err := hc.Write([]byte("after")); err != nil {
			t.Errorf("write: %v", err)
		}
		close(wrote)
	}()
	close(fc.blocking)
	require.NoError(t, <-released)
	<-wrote
	require.Equal(t, [][]byte{[]byte("held"), []byte("after")}, fc.got())
}

func TestHoldConn_ReleaseErrorBreaksTheConn(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	fc := &fakeConn{err: boom}
	hc := amqpdial.NewHoldConn(fc)
	hc.Hold()
	write(t, hc, "x") // queued: no error yet
	require.ErrorIs(t, hc.Release(), boom)
	fc.mu.Lock()
	require.True(t, fc.closed, "a failed write closes the connection: the stream is broken")
	fc.mu.Unlock()
	_, err := hc.Write([]byte("y"))
	require.ErrorIs(t, err, boom, "later writes fail")
	hc.Hold()
	_, err = hc.Write([]byte("z"))
	require.ErrorIs(t, err, boom, "held writes too")
	require.NoError(t, hc.Release())
}

func TestHoldConn_NotHeldWriteError(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	hc := amqpdial.NewHoldConn(&fakeConn{err: boom})
	n, err := hc.Write([]byte("x"))
	require.ErrorIs(t, err, boom)
	require.Zero(t, n)
}

// Closing during a hold drops the queued bytes; the Release says so.
func TestHoldConn_CloseDuringHold(t *testing.T) {
	t.Parallel()
	fc := &fakeConn{}
	hc := amqpdial.NewHoldConn(fc)
	hc.Hold()
	write(t, hc, "x")
	require.NoError(t, hc.Close())
	require.ErrorIs(t, hc.Release(), net.ErrClosed)
	require.Empty(t, fc.got())
	_, err := hc.Write([]byte("y"))
	require.ErrorIs(t, err, net.ErrClosed)
}

// Through a real broker: a connection from DialHeld publishes a batch held
// in one socket write, and the broker confirms every message.
func TestDialHeld_PublishesABatchInOneWrite(t *testing.T) {
	t.Parallel()
	d, err := amqpdial.New(amqpdial.Config{URL: testenv.AMQPURL(), Heartbeat: time.Minute})
	require.NoError(t, err)
	conn, hc, _, err := d.DialHeld(t.Context(), "amqpdial-test "+t.Name(), amqpdial.RoleRelay)
	if err != nil {
		testenv.Unavailable(t, "RabbitMQ", err)
	}
	defer conn.Close()
	require.NotNil(t, hc)
	admin := amqptest.Dial(t)
	q := amqptest.QueueName(t)
	ach, err := admin.Channel()
	require.NoError(t, err)
	_, err = ach.QueueDeclare(q, false, false, false, false, amqp.Table{"x-expires": int32(60_000)})
	require.NoError(t, err)

	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	const n = 20
	before := hc.Writes()
	hc.Hold()
	var dcs []*amqp.DeferredConfirmation
	for i := range n {
		dc, err := ch.PublishWithDeferredConfirmWithContext(t.Context(), "", q, true, false,
			amqp.Publishing{Body: fmt.Appendf(nil, "m%d", i)})
		require.NoError(t, err)
		dcs = append(dcs, dc)
	}
	require.Equal(t, before, hc.Writes(), "nothing written during the hold")
	require.NoError(t, hc.Release())
	require.Equal(t, before+1, hc.Writes(), "the batch in one write")
	for _, dc := range dcs {
		ok, err := dc.WaitContext(t.Context())
		require.NoError(t, err)
		require.True(t, ok)
	}
	require.Len(t, amqptest.Drain(t, admin, q), n)
}
