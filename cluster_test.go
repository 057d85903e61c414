package inboxmq_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// brokerNodeSeries returns the values of name by "node role" label pair.
func brokerNodeSeries(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			out[labels["node"]+" "+labels["role"]] = v
		}
	}
	return out
}

func nodeOf(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	return u.Host
}

// A worker given a cluster's nodes, the first one down, declares its
// exchanges and consumes through the live one, and its metrics say which
// node each connection is on (every node pre-initialised).
func TestWorker_ClusterURLReportsTheNode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dead, live := amqptest.DeadURL(t), testenv.AMQPURL()
	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, msg.Body.ID)
		return err
	}, nil)
	reg := prometheus.NewRegistry()
	w, err := inboxmq.NewWorker(&inboxmq.Config{
		URL:        dead + "," + live,
		Name:       "inboxmq-test-" + b.queue,
		DB:         b.pool,
		Routes:     routes,
		Registerer: reg,
		Exchanges:  []string{b.events},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	require.NoError(t, w.Start(t.Context()))
	b.pub.Publish(b.queue, []byte(`{"id":"o1"}`), amqp.Publishing{MessageId: "m1"})
	testenv.WaitFor(t, "the order's effect", func() bool { return b.count(t, `SELECT count(*) FROM effects`) == 1 })

	d, l := nodeOf(t, dead), nodeOf(t, live)
	conns := brokerNodeSeries(t, reg, "inboxmq_broker_node_connections")
	require.InDelta(t, 1, conns[l+" consumer"], 0)
	require.InDelta(t, 1, conns[l+" publisher"], 0)
	require.GreaterOrEqual(t, conns[l+" relay"], 1.0)
	for _, role := range []string{"consumer", "publisher", "relay", "parker"} {
		v, ok := conns[d+" "+role]
		require.True(t, ok, "the dead node's %s series is initialised: %v", role, conns)
		require.InDelta(t, 0, v, 0)
	}
	opened := brokerNodeSeries(t, reg, "inboxmq_broker_connections_total")
	require.InDelta(t, 1, opened[l+" consumer"], 0)
	require.InDelta(t, 0, opened[d+" consumer"], 0)

	require.NoError(t, w.Stop(context.Background()))
	testenv.WaitFor(t, "the connections closed", func() bool {
		c := brokerNodeSeries(t, reg, "inboxmq_broker_node_connections")
		return c[l+" consumer"] == 0 && c[l+" publisher"] == 0 && c[l+" relay"] == 0
	})
}
