package amqpdial_test

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/amqpdial"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/logtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// nodeEvents records OnNode calls.
type nodeEvents struct {
	mu     sync.Mutex
	events []string
}

func (e *nodeEvents) record(role, node string, connected bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	state := "closed"
	if connected {
		state = "open"
	}
	e.events = append(e.events, role+" "+node+" "+state)
}

func (e *nodeEvents) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.events...)
}

func addrOf(t *testing.T, raw string) string {
	t.Helper()
	nodes, err := amqpdial.Parse(raw)
	require.NoError(t, err)
	return nodes[0].Addr
}

// A node that is down is passed over: every dial lands on the live node,
// whichever node the rotation starts at, and the dead node is logged.
func TestDial_MovesPastADeadNode(t *testing.T) {
	t.Parallel()
	dead, live := amqptest.DeadURL(t), testenv.AMQPURL()
	log, rec := logtest.New(slog.LevelDebug)
	var ev nodeEvents
	d, err := amqpdial.New(amqpdial.Config{URL: dead + "," + live, Logger: log, OnNode: ev.record})
	require.NoError(t, err)
	liveAddr, deadAddr := addrOf(t, live), addrOf(t, dead)

	for i := range 2 { // two new connections: one of them starts at the dead node
		conn, node, err := d.Dial(t.Context(), fmt.Sprintf("amqpdial-test %s #%d", t.Name(), i), amqpdial.RoleConsumer)
		if err != nil {
			testenv.Unavailable(t, "RabbitMQ", err)
		}
		require.Equal(t, liveAddr, node.Addr, "the node reported is the one connected to")
		require.NoError(t, conn.Close())
	}

	unreachable := rec.Message("broker node unreachable")
	require.Len(t, unreachable, 1, "the dead node was tried once, by the dial that started there")
	require.Equal(t, deadAddr, unreachable[0].Attrs["node"])
	require.Equal(t, amqpdial.RoleConsumer, unreachable[0].Attrs["role"])
	connected := rec.Message("broker connection opened")
	require.Len(t, connected, 2)
	require.Equal(t, liveAddr, connected[0].Attrs["node"])
	require.NotContains(t, connected[0].Attrs["url"], "guest:guest", "the URL is redacted")
	testenv.WaitFor(t, "both closes reported", func() bool { return len(ev.list()) == 4 })
	require.Equal(t, []string{
		"consumer " + liveAddr + " open", "consumer " + liveAddr + " closed",
		"consumer " + liveAddr + " open", "consumer " + liveAddr + " closed",
	}, ev.list())
}

// Each new connection starts one node further than the previous one, so
// the connections of a process (and many processes, from their random
// start) spread over the nodes; a connection dialed again starts after the
// node it was on, and landing on another node is logged as a failover.
func TestDial_RotatesAndLogsFailover(t *testing.T) {
	t.Parallel()
	a, b := testenv.AMQPURL(), amqptest.AliasURL(t)
	log, rec := logtest.New(slog.LevelDebug)
	d, err := amqpdial.New(amqpdial.Config{URL: a + "," + b, Logger: log})
	require.NoError(t, err)
	var spread []string
	for i := range 2 {
		conn, node, err := d.Dial(t.Context(), fmt.Sprintf("amqpdial-test %s spread #%d", t.Name(), i), amqpdial.RoleConsumer)
		if err != nil {
			testenv.Unavailable(t, "RabbitMQ", err)
		}
		spread = append(spread, node.Addr)
		require.NoError(t, conn.Close())
	}
	require.NotEqual(t, spread[0], spread[1], "two new connections go to two nodes")
	require.Empty(t, rec.Message("broker failover"))

	var got []string
	for range 4 {
		conn, node, err := d.Dial(t.Context(), "amqpdial-test "+t.Name(), amqpdial.RoleRelay)
		if err != nil {
			testenv.Unavailable(t, "RabbitMQ", err)
		}
		got = append(got, node.Addr)
		require.NoError(t, conn.Close())
	}
	require.NotEqual(t, got[0], got[1])
	require.Equal(t, got[0], got[2])
	require.Equal(t, got[1], got[3])
	failovers := rec.Message("broker failover")
	require.Len(t, failovers, 3, "every redial after the first moved to the other node")
	require.Equal(t, got[0], failovers[0].Attrs["previous_node"])
	require.Equal(t, got[1], failovers[0].Attrs["node"])
}

// When no node answers, the error names every node (redacted) and keeps
// the causes for errors.Is.
func TestDial_NoNodeAnswers(t *testing.T) {
	t.Parallel()
	one, two := amqptest.DeadURL(t), amqptest.DeadURL(t)
	one = strings.Replace(one, "guest:guest@", "guest:s3cret@", 1)
	d, err := amqpdial.New(amqpdial.Config{URL: one + "," + two})
	require.NoError(t, err)
	conn, _, err := d.Dial(t.Context(), "amqpdial-test", amqpdial.RoleAdmin)
	require.Error(t, err)
	require.Nil(t, conn)
	require.Contains(t, err.Error(), "no broker node answered (2 nodes)")
	require.Contains(t, err.Error(), addrOf(t, one))
	require.Contains(t, err.Error(), addrOf(t, two))
	require.NotContains(t, err.Error(), "s3cret")
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
}

// A dial bounded by a cancelled context tries no node.
func TestDial_CancelledContext(t *testing.T) {
	t.Parallel()
	d, err := amqpdial.New(amqpdial.Config{URL: testenv.AMQPURL()})
	require.NoError(t, err)
	ctx, cancel := contextCancelled(t)
	defer cancel()
	_, _, err = d.Dial(ctx, "amqpdial-test", amqpdial.RoleAdmin)
	require.ErrorIs(t, err, errCanceled)
}
