package controlrun_test

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/controlrun"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// A DialParker dials its own connection, parks with confirm, dials again
// after the broker closed its connection, and refuses to park once closed.
func TestDialParker_RedialsAfterTheConnectionIsClosed(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	queue := amqptest.QueueName(t)
	conn := amqptest.Dial(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "dial-parker-test-" + hex.EncodeToString(b[:])
	p := controlrun.NewDialParker(testenv.AMQPURL(), &controlrun.DialParkerOpts{ConnectionName: name})
	t.Cleanup(func() { _ = p.Close() })

	park := func(id string) error {
		d := inboxtype.NewDelivery(queue, queue, "w1", &amqp.Delivery{MessageId: id, Body: []byte(`{}`)})
		d.Key = "k:" + id
		return p.Park(ctx, d, control.Block{Namespace: queue, Pattern: "k:" + id, Reason: "test"})
	}
	require.NoError(t, park("1"))
	require.Equal(t, 1, amqptest.Depth(t, conn, inboxtype.ParkedQueue(queue)))

	amqptest.CloseConnection(t, name)
	require.NoError(t, park("2"), "the parker dials again after a lost connection")
	parked := amqptest.Drain(t, conn, inboxtype.ParkedQueue(queue))
	require.Len(t, parked, 2)
	require.Equal(t, "k:2", parked[1].Headers[inboxtype.HeaderIdempotencyKey])
	require.Equal(t, "test", parked[1].Headers[inboxtype.HeaderParkedReason])

	require.NoError(t, p.Close())
	require.NoError(t, p.Close(), "Close is idempotent")
	require.Error(t, park("3"), "a closed parker refuses to park")
	require.Equal(t, 0, amqptest.Depth(t, conn, inboxtype.ParkedQueue(queue)))
}

// Given a cluster's nodes (a node that is down, and the test broker under
// two names), the parker parks through a node that answers, and after
// that node closed its connection, through another; OnBrokerNode reports
// each node.
func TestDialParker_FailsOverThroughTheNodeList(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	queue := amqptest.QueueName(t)
	conn := amqptest.Dial(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "dial-parker-test-" + hex.EncodeToString(b[:])
	live := testenv.AMQPURL()
	alias := amqptest.AliasURL(t)
	var mu sync.Mutex
	var opened []string
	p := controlrun.NewDialParker(amqptest.DeadURL(t)+","+live+","+alias, &controlrun.DialParkerOpts{
		ConnectionName: name,
		OnBrokerNode: func(role, node string, connected bool) {
			if connected && role == "parker" {
				mu.Lock()
				opened = append(opened, node)
				mu.Unlock()
			}
		},
	})
	t.Cleanup(func() { _ = p.Close() })
	park := func(id string) error {
		d := inboxtype.NewDelivery(queue, queue, "w1", &amqp.Delivery{MessageId: id, Body: []byte(`{}`)})
		d.Key = "k:" + id
		return p.Park(ctx, d, control.Block{Namespace: queue, Pattern: "k:" + id, Reason: "test"})
	}
	require.NoError(t, park("1"))
	amqptest.CloseConnection(t, name)
	require.NoError(t, park("2"), "the parker dials another node after a lost connection")
	require.Equal(t, 2, amqptest.Depth(t, conn, inboxtype.ParkedQueue(queue)))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, opened, 2)
	require.NotEqual(t, opened[0], opened[1], "the second connection went to another node")
}

// A parker whose URL does not parse says why on every Park.
func TestDialParker_BadURL(t *testing.T) {
	t.Parallel()
	p := controlrun.NewDialParker("amqp://u:s3cret@h1/,http://u:s3cret@h2/", nil)
	d := inboxtype.NewDelivery("q", "q", "w1", &amqp.Delivery{MessageId: "1"})
	err := p.Park(t.Context(), d, control.Block{Namespace: "q", Pattern: "k", Reason: "test"})
	require.ErrorContains(t, err, "controlrun: park: broker URL 2 of 2")
	require.NotContains(t, err.Error(), "s3cret")
}
